"""Commands of the batch API: upload a file, submit a batch or a summarization job,
cancel. Each checks what can be checked at once (so a client gets a clear error at
submit time), stores any bytes first and then appends its event: the event is the fact.
The tenant is always the principal's; objects of other tenants are not found.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from models import batch_keys as keys
from models import topics
from models.batch import BatchBook, BatchState, FileState
from models.events import Envelope, Payload, new_event
from models.events_batch import BatchCancelRequested, BatchSubmitted, FileUploaded, SummarizationSpec
from models.registry import Principal, Registry
from models.summarization import PlanError, Shape
from models.text import nested_too_deep
from pipelines.batch.tokens import template_ids, tokenizer_for
from pipelines.batch.view import BatchView
from pipelines.eventlog import EventLog
from pipelines.objectstore import ObjectStore
from pipelines.publish import publish
from pipelines.generation.submission import SubmissionError

BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
UPLOAD_PURPOSES = ("batch", "user_data")
SNIFF_BYTES = 64 * 1024
SNIFF_LINES = 64
WINDOW = timedelta(hours=24)


def _append(log: EventLog, principal: Principal, correlation_id: str, payload: Payload) -> Envelope:
    env = new_event(payload, tenant_id=principal.tenant_id, correlation_id=correlation_id)
    publish(log, topics.BATCHES, [env])
    return env


def _as_submitted(env: Envelope) -> BatchState:
    """The batch as its submission made it (the answer to a create, as OpenAI gives it:
    'validating'), however far the dispatcher got meanwhile."""
    return BatchBook().apply(env)


def sniff_file(f, filename: str = "") -> str | None:
    """'parquet', 'jsonl', or None for neither (binary, or no line that is a JSON object),
    from the start of the open, seekable binary file `f`. Lines are read whole, however
    long (the file's size is bounded before this), so where a long line falls changes
    nothing: the first `SNIFF_LINES` lines are looked at, fewer once `SNIFF_BYTES` are read."""
    head = f.read(4)
    if head == b"PAR1" or filename.endswith(".parquet"):
        return "parquet" if head == b"PAR1" else None
    f.seek(0)
    lines, seen = [], 0
    line = f.readline()
    while line and len(lines) < SNIFF_LINES and seen < SNIFF_BYTES:
        lines.append(line)
        seen += len(line)
        line = f.readline()
    for line in lines:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            return None  # binary
        if "\x00" in text:
            return None
    for line in lines:
        try:
            if not nested_too_deep(line) and isinstance(json.loads(line), dict):
                return "jsonl"
        except ValueError:
            continue
    return None


def _sniff_local(path: str, filename: str) -> str | None:
    with open(path, "rb") as f:
        return sniff_file(f, filename)


def upload_file(*, principal: Principal, store: ObjectStore, log: EventLog, filename: str, purpose: str,
                local_path: str, max_bytes: int) -> FileState:
    if purpose not in UPLOAD_PURPOSES:
        raise SubmissionError(400, "invalid_purpose", f"purpose must be one of {', '.join(UPLOAD_PURPOSES)}",
                              "purpose")
    digest, size = hashlib.sha256(), 0
    with open(local_path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            size += len(block)
    if size > max_bytes:
        raise SubmissionError(413, "file_too_large", f"the file has {size} bytes; the limit is {max_bytes}", "file")
    if size == 0:
        raise SubmissionError(400, "empty_file", "the file is empty", "file")
    if purpose == "batch" and _sniff_local(local_path, filename) is None:
        raise SubmissionError(400, "invalid_file_format", "a batch file must be JSONL (one JSON object per "
                              "line) or, for summarization jobs, Parquet", "file")
    file_id = "file-" + uuid.uuid4().hex[:24]
    key = keys.file_key(principal.tenant_id, file_id)
    store.put_file(key, local_path)
    event = FileUploaded(file_id=file_id, purpose=purpose, filename=filename[:255] or "upload", bytes=size,
                         object_key=key, sha256=digest.hexdigest())
    _append(log, principal, file_id, event)
    return FileState(principal.tenant_id, file_id, purpose, event.filename, size, key, datetime.now(timezone.utc))


def _check_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    metadata = metadata or {}
    if len(metadata) > 16 or any(len(k) > 64 or len(str(v)) > 512 for k, v in metadata.items()):
        raise SubmissionError(400, "invalid_metadata", "metadata takes at most 16 pairs, keys of at most 64 "
                              "characters and values of at most 512", "metadata")
    return {str(k): str(v) for k, v in metadata.items()}


def _input_file(view: BatchView, principal: Principal, file_id: str) -> FileState:
    found = view.file(principal.tenant_id, file_id)
    if found is None:
        raise SubmissionError(404, "file_not_found", f"No such File object: {file_id}", "input_file_id")
    return found


@dataclass(frozen=True)
class SubmitBatch:
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] = field(default_factory=dict)


def submit_batch(cmd: SubmitBatch, *, principal: Principal, view: BatchView, store: ObjectStore,
                 log: EventLog) -> BatchState:
    if cmd.endpoint not in BATCH_ENDPOINTS:
        raise SubmissionError(400, "unsupported_endpoint", f"endpoint {cmd.endpoint!r} is not served in batches; "
                              f"use one of {', '.join(BATCH_ENDPOINTS)}", "endpoint")
    if cmd.completion_window != "24h":
        raise SubmissionError(400, "invalid_completion_window", "completion_window must be '24h'",
                              "completion_window")
    metadata = _check_metadata(cmd.metadata)
    file = _input_file(view, principal, cmd.input_file_id)
    if file.purpose != "batch":
        raise SubmissionError(400, "invalid_file_purpose", f"file {file.file_id} has purpose {file.purpose!r}, "
                              "not 'batch'", "input_file_id")
    with store.open_read(file.object_key) as f:
        if sniff_file(f) != "jsonl":
            raise SubmissionError(400, "invalid_file_format", f"file {file.file_id} is not JSONL", "input_file_id")
    batch_id = "batch_" + uuid.uuid4().hex[:24]
    return _as_submitted(_append(log, principal, batch_id, BatchSubmitted(
        batch_id=batch_id, endpoint=cmd.endpoint, input_file_id=file.file_id, input_key=file.object_key,
        expires_at=datetime.now(timezone.utc) + WINDOW, metadata=metadata,
        application_id=principal.application_id, key_id=principal.key_id)))


@dataclass(frozen=True)
class SubmitSummarization:
    model: str
    prompt_template: str
    max_output_tokens: int
    input_file_id: str | None = None
    input_url: str | None = None
    temperature: float = 0.0
    metadata: dict[str, str] = field(default_factory=dict)


def _summary_input(cmd: SubmitSummarization, principal: Principal, view: BatchView, store: ObjectStore,
                   max_bytes: int) -> tuple[str, str, str | None]:
    """(object key, format, file id) of the job's input, readable by this tenant only."""
    if (cmd.input_file_id is None) == (cmd.input_url is None):
        raise SubmissionError(400, "invalid_input", "give exactly one of input_file_id and input_url", "input_url")
    if cmd.input_file_id is not None:
        file = _input_file(view, principal, cmd.input_file_id)
        key, name, file_id = file.object_key, file.filename, file.file_id
    else:
        key, name, file_id = store.key_for_uri(cmd.input_url), cmd.input_url, None
        prefix = keys.tenant_prefix(principal.tenant_id)
        # Another tenant's object and a missing one get the same answer.
        if key is None or not key.startswith(prefix) or not store.exists(key):
            raise SubmissionError(404, "input_not_found", f"{cmd.input_url} does not exist or is not under your "
                                  f"prefix {store.uri(prefix)}", "input_url")
    size = store.size(key) or 0
    if size > max_bytes:
        raise SubmissionError(413, "file_too_large", f"the input has {size} bytes; the limit is {max_bytes}",
                              "input_url")
    with store.open_read(key) as f:
        fmt = sniff_file(f, name)
    if fmt is None:
        raise SubmissionError(400, "invalid_file_format", "the input must be Parquet or JSONL with columns id "
                              "and text", "input_url" if file_id is None else "input_file_id")
    return key, fmt, file_id


def submit_summarization(cmd: SubmitSummarization, *, principal: Principal, registry: Registry, view: BatchView,
                         store: ObjectStore, log: EventLog, max_bytes: int) -> BatchState:
    if cmd.prompt_template.count("{text}") != 1:
        raise SubmissionError(400, "invalid_prompt_template", "prompt_template must contain '{text}' exactly once",
                              "prompt_template")
    revision = registry.resolve_alias(cmd.model, principal.tenant_id)
    if revision is None:
        raise SubmissionError(404, "model_not_found", f"The model '{cmd.model}' does not exist", "model")
    tids = template_ids(tokenizer_for(revision.model_path), cmd.prompt_template)
    try:
        Shape(revision.max_model_len, tids.overhead, cmd.max_output_tokens, len(tids.sep)).check()
    except PlanError as exc:
        raise SubmissionError(400, "invalid_max_output_tokens", str(exc), "max_output_tokens") from None
    metadata = _check_metadata(cmd.metadata)
    input_key, fmt, file_id = _summary_input(cmd, principal, view, store, max_bytes)
    batch_id = "summ_" + uuid.uuid4().hex[:24]
    spec_key = keys.spec_key(principal.tenant_id, batch_id)
    spec_bytes = json.dumps({"prompt_template": cmd.prompt_template}).encode()
    store.put_bytes(spec_key, spec_bytes)
    spec = SummarizationSpec(input_format=fmt, spec_key=spec_key,
                             template_sha256=hashlib.sha256(cmd.prompt_template.encode()).hexdigest(),
                             max_output_tokens=cmd.max_output_tokens, temperature=cmd.temperature,
                             output_prefix=keys.summarization_prefix(principal.tenant_id, batch_id))
    return _as_submitted(_append(log, principal, batch_id, BatchSubmitted(
        batch_id=batch_id, endpoint="/v1/summarizations", input_file_id=file_id, input_key=input_key,
        expires_at=datetime.now(timezone.utc) + WINDOW, metadata=metadata, application_id=principal.application_id,
        key_id=principal.key_id, model_alias=cmd.model, summarization=spec)))


def cancel_batch(batch_id: str, *, principal: Principal, view: BatchView, log: EventLog,
                 kind: str = "batch") -> BatchState:
    batch = view.batch(principal.tenant_id, batch_id)
    if batch is None or (batch.summarization is not None) != (kind == "summarization"):
        raise SubmissionError(404, "not_found", f"No such {kind}: {batch_id}")
    if batch.status in ("cancelling", "cancelled"):
        return batch
    if batch.terminal or batch.status == "finalizing":
        raise SubmissionError(409, "invalid_state", f"cannot cancel a {kind} that is {batch.status}")
    _append(log, principal, batch_id, BatchCancelRequested(batch_id=batch_id, key_id=principal.key_id))
    return view.batch(principal.tenant_id, batch_id)


def copy_upload(source, target_path: str) -> None:
    """Spools an upload to a local file, so its size is known before it is stored."""
    with open(target_path, "wb") as out:
        shutil.copyfileobj(source, out, 1 << 20)
