"""Events of offline jobs: uploaded files, batches (OpenAI Batch API and summarization
jobs), their chunks, budgets and outcomes. All live on the durable `ledgerlm.batches`
topic, keyed by tenant, so one dispatcher owns each tenant's batches and budget.

No prompt, completion or document text appears here: that stays in the object store
(input files, chunk inputs, Parquet parts); events carry keys, counts and hashes.
"""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from models.event_types import Payload, event

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/summarizations"]
SkipReason = Literal["insufficient_quota", "batch_cancelled", "batch_expired"]


class RequestCounts(Payload):
    total: int = Field(default=0, ge=0)
    completed: int = Field(default=0, ge=0)
    failed: int = Field(default=0, ge=0)


class BatchError(Payload):
    """A batch-level error (OpenAI's `errors.data[]`): why the whole input was refused."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None


class ChunkPlan(Payload):
    """One chunk as validation planned it: its size and the most it may use, which is
    what gets reserved before it runs."""

    chunk_index: int = Field(ge=0)
    requests: int = Field(ge=0)
    tokens: int = Field(ge=0)
    cost_micros: int = Field(ge=0)


class SummarizationSpec(Payload):
    """How a summarization job runs. The prompt template itself is in the object store
    (`spec_key`); only its hash is kept here."""

    input_format: Literal["parquet", "jsonl"]
    spec_key: str
    template_sha256: str
    max_output_tokens: int = Field(gt=0)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    output_prefix: str


@event("FileUploaded")
class FileUploaded(Payload):
    file_id: str
    purpose: str
    filename: str
    bytes: int = Field(ge=0)
    object_key: str
    sha256: str
    batch_id: str | None = None  # set on output and error files of a batch


@event("FileDeleted")
class FileDeleted(Payload):
    file_id: str


@event("BatchSubmitted")
class BatchSubmitted(Payload):
    batch_id: str
    endpoint: Endpoint
    input_file_id: str | None = None
    input_key: str
    completion_window: Literal["24h"] = "24h"
    expires_at: datetime
    metadata: dict[str, str] = {}
    application_id: str = "default"
    key_id: str | None = None
    model_alias: str | None = None  # summarization jobs name it; batch lines carry their own
    summarization: SummarizationSpec | None = None


@event("BatchValidated")
class BatchValidated(Payload):
    batch_id: str
    model_alias: str
    model_revision: str
    total_requests: int = Field(ge=0)
    invalid_requests: int = Field(ge=0)
    chunks: tuple[ChunkPlan, ...]


@event("BatchFailed")
class BatchFailed(Payload):
    """The input as a whole could not be used (missing, not JSONL, no valid request)."""

    batch_id: str
    errors: tuple[BatchError, ...]
    error_file_id: str | None = None
    request_counts: RequestCounts = RequestCounts()


@event("BatchChunkQueued")
class BatchChunkQueued(Payload):
    """The chunk's budget is reserved and its task handed to the batch queue."""

    batch_id: str
    chunk_index: int = Field(ge=0)
    reservation_id: str
    tokens: int = Field(ge=0)
    cost_micros: int = Field(ge=0)


@event("BatchChunkStarted")
class BatchChunkStarted(Payload):
    batch_id: str
    chunk_index: int = Field(ge=0)
    worker_id: str
    attempt: int = Field(ge=1)


@event("BatchEngineStarting")
class BatchEngineStarting(Payload):
    """The worker running this chunk began starting its engine (loading the model), which
    takes a while before any request of the chunk runs."""

    batch_id: str
    chunk_index: int = Field(ge=0)
    worker_id: str


@event("BatchEngineStarted")
class BatchEngineStarted(Payload):
    """The engine is up; the chunk's requests run next."""

    batch_id: str
    chunk_index: int = Field(ge=0)
    worker_id: str
    duration_ms: int = Field(default=0, ge=0)


@event("BatchWaitingForPool")
class BatchWaitingForPool(Payload):
    """The batch's queued chunks wait on the batch queue of its tenant's dedicated pool,
    which has no live batch worker; they never go to the shared pool. A chunk starting
    ends the wait."""

    batch_id: str
    pool: str


@event("BatchChunkCompleted")
class BatchChunkCompleted(Payload):
    """The chunk's one Parquet part is written; usage is what its requests used."""

    batch_id: str
    chunk_index: int = Field(ge=0)
    part_key: str
    completed: int = Field(ge=0)
    failed: int = Field(ge=0)
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    model_revision: str
    worker_id: str
    duration_ms: int = Field(default=0, ge=0)
    map_reduced: int = Field(default=0, ge=0)  # summarization documents split map-reduce style


@event("BatchChunkFailed")
class BatchChunkFailed(Payload):
    """The chunk gave up after its retries; every request in it is reported failed."""

    batch_id: str
    chunk_index: int = Field(ge=0)
    error_code: str
    message: str
    worker_id: str = ""


@event("BatchChunkSkipped")
class BatchChunkSkipped(Payload):
    """The chunk never ran: out of budget, or its batch was cancelled or expired."""

    batch_id: str
    chunk_index: int = Field(ge=0)
    reason: SkipReason


@event("BatchUsageSettled")
class BatchUsageSettled(Payload):
    """A chunk's reservation closed: what was used is charged, the rest released."""

    batch_id: str
    chunk_index: int = Field(ge=0)
    reservation_id: str
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    cost_micros: int = Field(ge=0)
    released_tokens: int = Field(ge=0)
    released_cost_micros: int = Field(ge=0)


@event("BatchCancelRequested")
class BatchCancelRequested(Payload):
    batch_id: str
    key_id: str | None = None


@event("BatchWindowElapsed")
class BatchWindowElapsed(Payload):
    """The completion window passed: no new chunk starts, the batch will end expired."""

    batch_id: str


@event("BatchFinalizationStarted")
class BatchFinalizationStarted(Payload):
    batch_id: str


class _BatchEnded(Payload):
    batch_id: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    output_uri: str | None = None  # summarization jobs: the Parquet dataset and its manifest
    request_counts: RequestCounts
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)


@event("BatchCompleted")
class BatchCompleted(_BatchEnded):
    pass


@event("BatchCancelled")
class BatchCancelled(_BatchEnded):
    pass


@event("BatchExpired")
class BatchExpired(_BatchEnded):
    pass


CHUNK_TERMINAL = (BatchChunkCompleted, BatchChunkFailed, BatchChunkSkipped)
BATCH_TERMINAL = (BatchCompleted, BatchCancelled, BatchExpired, BatchFailed)
