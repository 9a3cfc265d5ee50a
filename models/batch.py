"""The batch lifecycle, as the batch events tell it. Pure: `BatchBook.apply` folds
envelopes into states; the API's view and the dispatcher fold the same events the same
way, so what a client sees is what the dispatcher decides on.

`apply` is idempotent and order-tolerant where the log can reorder facts: a chunk's
completion may land before its `BatchChunkQueued` (the task is enqueued before the
dispatcher commits), and a retried task may report twice. The first terminal report of
a chunk wins; later ones change nothing.

OpenAI states: validating → in_progress → finalizing → completed; validating → failed;
cancel → cancelling → cancelled; completion window passed → expired.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from models.events import Envelope
from models.events_batch import (
    BATCH_TERMINAL, BatchCancelled, BatchCancelRequested, BatchChunkCompleted, BatchChunkFailed, BatchChunkQueued,
    BatchChunkSkipped, BatchChunkStarted, BatchCompleted, BatchEngineStarted, BatchEngineStarting, BatchError,
    BatchExpired, BatchFailed, BatchFinalizationStarted, BatchSubmitted, BatchUsageSettled, BatchValidated, BatchWaitingForPool, BatchWindowElapsed, FileDeleted,
    FileUploaded, RequestCounts, SummarizationSpec,
)

Status = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                 "cancelled"]
ChunkStatus = Literal["pending", "queued", "running", "completed", "failed", "skipped"]
TERMINAL: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
ENGINE_STARTING = "starting the batch engine"
WAITING_FOR_POOL = "waiting for a batch worker of pool {pool}"


@dataclass
class ChunkState:
    index: int
    requests: int
    tokens: int
    cost_micros: int
    status: ChunkStatus = "pending"
    reservation_id: str | None = None
    reserved_tokens: int = 0
    reserved_cost_micros: int = 0
    settled: bool = False
    attempts: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    map_reduced: int = 0
    part_key: str | None = None
    error_code: str | None = None  # failure code or skip reason
    queued_at: datetime | None = None
    started_at: datetime | None = None
    engine_starting: bool = False  # its worker reported starting an engine and not yet that it is up

    @property
    def terminal(self) -> bool:
        return self.status in ("completed", "failed", "skipped")

    @property
    def needs_settlement(self) -> bool:
        return self.terminal and self.reservation_id is not None and not self.settled


@dataclass
class BatchState:
    tenant_id: str
    batch_id: str
    endpoint: str
    input_key: str
    input_file_id: str | None
    completion_window: str
    created_at: datetime
    expires_at: datetime
    metadata: dict[str, str]
    application_id: str
    model_alias: str | None
    summarization: SummarizationSpec | None
    status: Status = "validating"
    model_revision: str | None = None
    total_requests: int = 0
    invalid_requests: int = 0
    chunks: list[ChunkState] = field(default_factory=list)
    validated: bool = False
    cancel_requested: bool = False
    window_elapsed: bool = False
    finalizing: bool = False
    errors: tuple[BatchError, ...] = ()
    output_file_id: str | None = None
    error_file_id: str | None = None
    output_uri: str | None = None
    ended_counts: RequestCounts | None = None
    times: dict[str, datetime] = field(default_factory=dict)  # in_progress_at, cancelling_at, ...
    waiting_for_pool: str | None = None  # its dedicated pool had no batch worker; cleared when a chunk starts

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def stopping(self) -> bool:
        """No new chunk may start: cancelled or out of time."""
        return self.cancel_requested or self.window_elapsed

    @property
    def request_counts(self) -> RequestCounts:
        if self.ended_counts is not None:
            return self.ended_counts
        completed = sum(c.completed for c in self.chunks)
        failed = self.invalid_requests + sum(
            c.failed if c.status == "completed" else c.requests for c in self.chunks if c.terminal)
        return RequestCounts(total=self.total_requests, completed=completed, failed=failed)

    @property
    def usage(self) -> tuple[int, int]:
        return (sum(c.input_tokens for c in self.chunks), sum(c.output_tokens for c in self.chunks))

    @property
    def status_detail(self) -> str | None:
        """What a running batch is doing besides its status: only what a worker reported."""
        if not self.terminal and any(c.engine_starting and c.status == "running" for c in self.chunks):
            return ENGINE_STARTING
        if not self.terminal and self.waiting_for_pool and not any(c.status == "running" for c in self.chunks):
            return WAITING_FOR_POOL.format(pool=self.waiting_for_pool)
        return None

    def in_flight(self) -> list[ChunkState]:
        return [c for c in self.chunks if c.status in ("queued", "running")]

    def pending(self) -> list[ChunkState]:
        return [c for c in self.chunks if c.status == "pending"]

    def all_chunks_terminal(self) -> bool:
        return self.validated and all(c.terminal and not c.needs_settlement for c in self.chunks)

    def _at(self, name: str, when: datetime) -> None:
        self.times.setdefault(name, when)

    def apply(self, env: Envelope) -> None:
        p, when = env.payload, env.occurred_at
        if self.terminal:
            return  # nothing changes an ended batch; late chunk reports are ignored
        if isinstance(p, BatchValidated):
            if not self.validated:
                self.validated = True
                self.model_alias, self.model_revision = p.model_alias, p.model_revision
                self.total_requests, self.invalid_requests = p.total_requests, p.invalid_requests
                self.chunks = [ChunkState(c.chunk_index, c.requests, c.tokens, c.cost_micros) for c in p.chunks]
                self._at("in_progress_at", when)
                if self.status == "validating":
                    self.status = "in_progress"
        elif isinstance(p, BatchCancelRequested):
            if self.status in ("validating", "in_progress") and not self.cancel_requested:
                self.cancel_requested = True
                self.status = "cancelling"
                self._at("cancelling_at", when)
        elif isinstance(p, BatchWindowElapsed):
            self.window_elapsed = True
        elif isinstance(p, BatchWaitingForPool):
            self.waiting_for_pool = p.pool
        elif isinstance(p, BatchFinalizationStarted):
            self.finalizing = True
            self._at("finalizing_at", when)
            if self.status == "in_progress" and not self.stopping:
                self.status = "finalizing"
        elif isinstance(p, (BatchChunkQueued, BatchChunkStarted, BatchChunkCompleted, BatchChunkFailed,
                            BatchChunkSkipped, BatchUsageSettled, BatchEngineStarting, BatchEngineStarted)):
            if self.validated and 0 <= p.chunk_index < len(self.chunks):
                apply_chunk(self.chunks[p.chunk_index], p, when)
            if isinstance(p, BatchChunkStarted):
                self.waiting_for_pool = None  # a worker took a chunk: the wait is over
        elif isinstance(p, BATCH_TERMINAL):
            self._end(p, when)

    def _end(self, p, when: datetime) -> None:
        if isinstance(p, BatchFailed):
            self.status, self.errors, self.error_file_id = "failed", p.errors, p.error_file_id
            self.ended_counts = p.request_counts
            self._at("failed_at", when)
            return
        self.status = {BatchCompleted: "completed", BatchCancelled: "cancelled", BatchExpired: "expired"}[type(p)]
        self._at(f"{self.status}_at", when)
        self.output_file_id, self.error_file_id, self.output_uri = p.output_file_id, p.error_file_id, p.output_uri
        self.ended_counts = p.request_counts


def apply_chunk(chunk: ChunkState, p, when: datetime) -> None:
    if isinstance(p, BatchChunkQueued):
        if chunk.reservation_id is None:
            chunk.reservation_id = p.reservation_id
            chunk.reserved_tokens, chunk.reserved_cost_micros = p.tokens, p.cost_micros
            chunk.queued_at = when
        if chunk.status == "pending":
            chunk.status = "queued"
    elif isinstance(p, BatchChunkStarted):
        chunk.attempts = max(chunk.attempts, p.attempt)  # re-applying a report changes nothing
        chunk.started_at = max(chunk.started_at or when, when)
        if chunk.status in ("pending", "queued"):
            chunk.status = "running"
        chunk.engine_starting = False  # an attempt begins; its worker says if it must start an engine
    elif isinstance(p, BatchEngineStarting):
        chunk.engine_starting = not chunk.terminal
    elif isinstance(p, BatchEngineStarted):
        chunk.engine_starting = False
    elif isinstance(p, BatchUsageSettled):
        chunk.settled = True
    elif chunk.terminal:
        return  # the first terminal report of a chunk wins
    elif isinstance(p, BatchChunkCompleted):
        chunk.status, chunk.part_key = "completed", p.part_key
        chunk.completed, chunk.failed = p.completed, p.failed
        chunk.input_tokens, chunk.output_tokens, chunk.map_reduced = p.input_tokens, p.output_tokens, p.map_reduced
    elif isinstance(p, BatchChunkFailed):
        chunk.status, chunk.error_code = "failed", p.error_code
    elif isinstance(p, BatchChunkSkipped):
        chunk.status, chunk.error_code = "skipped", p.reason


@dataclass
class FileState:
    tenant_id: str
    file_id: str
    purpose: str
    filename: str
    bytes: int
    object_key: str
    created_at: datetime
    batch_id: str | None = None


@dataclass
class BatchBook:
    """Every batch and file of the tenants whose events were applied, by (tenant, id)."""

    batches: dict[tuple[str, str], BatchState] = field(default_factory=dict)
    files: dict[tuple[str, str], FileState] = field(default_factory=dict)

    def apply(self, env: Envelope) -> BatchState | None:
        """Applies one event; returns the batch it concerns, if any."""
        p, tenant = env.payload, env.tenant_id
        if isinstance(p, FileUploaded):
            self.files.setdefault((tenant, p.file_id), FileState(
                tenant, p.file_id, p.purpose, p.filename, p.bytes, p.object_key, env.occurred_at, p.batch_id))
            return None
        if isinstance(p, FileDeleted):
            self.files.pop((tenant, p.file_id), None)
            return None
        if isinstance(p, BatchSubmitted):
            return self.batches.setdefault((tenant, p.batch_id), BatchState(
                tenant_id=tenant, batch_id=p.batch_id, endpoint=p.endpoint, input_key=p.input_key,
                input_file_id=p.input_file_id, completion_window=p.completion_window, created_at=env.occurred_at,
                expires_at=p.expires_at, metadata=dict(p.metadata), application_id=p.application_id,
                model_alias=p.model_alias, summarization=p.summarization))
        batch_id = getattr(p, "batch_id", None)
        state = self.batches.get((tenant, batch_id)) if batch_id else None
        if state is not None:
            state.apply(env)
        return state

    def active(self) -> list[BatchState]:
        return [b for b in self.batches.values() if not b.terminal]

    def for_tenant(self, tenant_id: str) -> list[BatchState]:
        return [b for (t, _), b in self.batches.items() if t == tenant_id]
