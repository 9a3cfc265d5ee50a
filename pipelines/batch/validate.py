"""Validating a submitted batch: every input line or row is checked on its own, bad ones
become error lines, good ones are tokenized and split into chunks whose inputs are
written to the object store (at keys of (tenant, batch, chunk), so redoing this after a
crash writes the same objects). A bad line never fails the good ones; only an input that
cannot be read at all, or has no usable request, fails the batch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from models import batch_keys as keys
from models.batch import BatchState
from models.events_batch import BatchError, ChunkPlan
from models.registry import Registry, Revision
from models.summarization import PlanError, Shape, plan
from models.text import nested_too_deep
from pipelines.admission.decisions import cost_micros
from pipelines.batch.lines import LineError, ParsedLine, error_line, parse_line
from pipelines.batch.schemas import DOCUMENT_INPUT, REQUEST_INPUT, write_table
from pipelines.batch.tokens import encode_chat, encode_completion, encode_text, template_ids, tokenizer_for
from pipelines.generation.tokencount import ChatTemplateMissing, chat_template_missing
from pipelines.objectstore import ObjectNotFound, ObjectStore


class BatchInputError(Exception):
    def __init__(self, code: str, message: str, *, total: int = 0, invalid: list[dict] | None = None):
        super().__init__(message)
        self.error = BatchError(code=code, message=message)
        self.total, self.invalid = total, invalid or []  # OpenAI batches: the error file's lines


@dataclass
class Validation:
    model_alias: str
    revision: Revision
    total: int = 0
    invalid: list[dict] = field(default_factory=list)  # error-file lines, or error rows for summaries
    chunks: list[ChunkPlan] = field(default_factory=list)


def _chunked(store: ObjectStore, batch: BatchState, rows: list[dict], bounds: list[tuple[int, int]],
             chunk_size: int, schema, revision: Revision) -> list[ChunkPlan]:
    plans = []
    for index, start in enumerate(range(0, len(rows), chunk_size)):
        part = slice(start, start + chunk_size)
        write_table(store, keys.chunk_input_key(batch.tenant_id, batch.batch_id, index), rows[part], schema)
        tokens = sum(i + o for i, o in bounds[part])
        cost = sum(cost_micros(revision, i, o) for i, o in bounds[part])
        plans.append(ChunkPlan(chunk_index=index, requests=len(rows[part]), tokens=tokens, cost_micros=cost))
    return plans


def _lines(store: ObjectStore, key: str, max_requests: int):
    try:
        f = store.open_read(key)
    except ObjectNotFound:
        raise BatchInputError("file_not_found", "the input file no longer exists") from None
    with f:
        for number, raw in enumerate(f, start=1):
            if number > max_requests:
                raise BatchInputError("too_many_requests", f"the input has more than {max_requests} lines")
            if raw.strip():
                yield number, raw


def validate_requests(batch: BatchState, *, store: ObjectStore, registry: Registry, chunk_size: int,
                      max_requests: int) -> Validation:
    """An OpenAI batch: JSONL of requests to `batch.endpoint`."""
    seen: set[str] = set()
    parsed: list[ParsedLine] = []
    result: Validation | None = None
    invalid: list[dict] = []
    total = 0
    for number, raw in _lines(store, batch.input_key, max_requests):
        total += 1
        try:
            line = parse_line(raw, number, batch.endpoint)
            if line.custom_id in seen:
                raise LineError("duplicate_custom_id", f"line {number}: custom_id {line.custom_id!r} "
                                "was used on an earlier line", line.custom_id)
            seen.add(line.custom_id)
            revision = registry.resolve_alias(line.model, batch.tenant_id)
            if revision is None:
                raise LineError("model_not_found", f"line {number}: the model {line.model!r} does not exist",
                                line.custom_id)
            if result is None:
                result = Validation(model_alias=line.model, revision=revision)
            elif line.model != result.model_alias:
                raise LineError("mismatched_model", f"line {number}: every line of a batch must use the same "
                                f"model ({result.model_alias!r})", line.custom_id)
            parsed.append(line)
        except LineError as err:
            invalid.append(error_line(batch.batch_id, number, err.custom_id, err.code, err.message))
    if result is None:
        raise BatchInputError("no_valid_requests", f"none of the {total} lines is a valid request"
                              + (f"; line {invalid[0]['error']['line']}: {invalid[0]['error']['message']}"
                                 if invalid else ""), total=total, invalid=invalid)
    revision = result.revision
    tokenizer = tokenizer_for(revision.model_path)
    rows, bounds = [], []
    for line in parsed:
        try:
            ids = encode_chat(tokenizer, line.messages) if line.messages is not None else \
                encode_completion(tokenizer, line.prompt)
        except ChatTemplateMissing:
            invalid.append(error_line(batch.batch_id, line.line, line.custom_id, "chat_template_missing",
                                      f"line {line.line}: {chat_template_missing(revision.model_revision)}"))
            continue
        max_tokens = line.max_tokens or max(1, revision.max_model_len - len(ids))
        if len(ids) + max_tokens > revision.max_model_len:
            invalid.append(error_line(batch.batch_id, line.line, line.custom_id, "context_length_exceeded",
                                      f"line {line.line}: {len(ids)} input tokens + {max_tokens} max_tokens exceed "
                                      f"the model's context of {revision.max_model_len}"))
            continue
        rows.append({"line": line.line, "custom_id": line.custom_id, "prompt_token_ids": ids,
                     "max_tokens": max_tokens, "temperature": line.temperature, "top_p": line.top_p,
                     "seed": line.seed, "stop": line.stop, "ignore_eos": line.ignore_eos})
        bounds.append((len(ids), max_tokens))
    if not rows:
        invalid.sort(key=lambda e: e["error"]["line"])
        raise BatchInputError("no_valid_requests", f"no request can run on the model: {invalid[0]['error']['message']}",
                              total=total, invalid=invalid)
    result.total, result.invalid = total, sorted(invalid, key=lambda e: e["error"]["line"])
    result.chunks = _chunked(store, batch, rows, bounds, chunk_size, REQUEST_INPUT, revision)
    return result


def _documents(store: ObjectStore, key: str, input_format: str, max_rows: int):
    """(row number, id, text) of each row; id or text None when missing."""
    if input_format == "jsonl":
        for number, raw in _lines(store, key, max_rows):
            try:
                data = None if nested_too_deep(raw) else json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError):
                data = None
            if data is None:
                yield number, None, None
                continue
            yield (number, *((data.get("id"), data.get("text")) if isinstance(data, dict) else (None, None)))
        return
    import pyarrow.parquet as pq

    try:
        with store.open_read(key) as f:
            parquet = pq.ParquetFile(f)
            names = set(parquet.schema_arrow.names)
            if not {"id", "text"} <= names:
                raise BatchInputError("invalid_input", f"the Parquet input needs columns id and text; it has "
                                      f"{sorted(names)}")
            number = 0
            for record_batch in parquet.iter_batches(columns=["id", "text"], batch_size=1024):
                for row in record_batch.to_pylist():
                    number += 1
                    if number > max_rows:
                        raise BatchInputError("too_many_requests", f"the input has more than {max_rows} rows")
                    yield number, row["id"], row["text"]
    except ObjectNotFound:
        raise BatchInputError("file_not_found", "the input no longer exists") from None
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid and ArrowIOError among them
        raise BatchInputError("invalid_input", f"the input is not a readable Parquet file: {exc}") from None


def summary_error(row: int, doc_id, code: str, message: str, model_revision: str) -> dict:
    return {"row": row, "id": None if doc_id is None else str(doc_id), "code": code, "message": message,
            "model_revision": model_revision}


def validate_documents(batch: BatchState, *, store: ObjectStore, registry: Registry, chunk_size: int,
                       max_requests: int) -> Validation:
    """A summarization job: rows of (id, text) in Parquet or JSONL."""
    spec = batch.summarization
    revision = registry.resolve_alias(batch.model_alias or "", batch.tenant_id)
    if revision is None:
        raise BatchInputError("model_not_found", f"the model {batch.model_alias!r} does not exist")
    template = json.loads(store.get_bytes(spec.spec_key))["prompt_template"]
    tokenizer = tokenizer_for(revision.model_path)
    tids = template_ids(tokenizer, template)
    shape = Shape(revision.max_model_len, tids.overhead, spec.max_output_tokens, len(tids.sep))
    try:
        shape.check()
    except PlanError as exc:
        raise BatchInputError("invalid_max_output_tokens", str(exc)) from None
    result = Validation(model_alias=batch.model_alias, revision=revision)
    seen: set[str] = set()
    rows, bounds = [], []
    for number, doc_id, text in _documents(store, batch.input_key, spec.input_format, max_requests):
        result.total += 1
        error = None
        if doc_id is None or str(doc_id) == "":
            error = ("missing_id", f"row {number} has no id")
        elif str(doc_id) in seen:
            error = ("duplicate_id", f"row {number}: id {str(doc_id)!r} was used on an earlier row")
        elif not isinstance(text, str) or not text.strip():
            error = ("invalid_text", f"row {number}: text must be a non-empty string")
        if error:
            result.invalid.append(summary_error(number, doc_id, *error, revision.model_revision))
            continue
        seen.add(str(doc_id))
        ids = encode_text(tokenizer, text)
        doc_plan = plan(len(ids), shape)
        rows.append({"row": number, "id": str(doc_id), "text_token_ids": ids})
        bounds.append((doc_plan.input_tokens_bound, doc_plan.output_tokens_bound))
    if not rows:
        raise BatchInputError("no_valid_requests", f"none of the {result.total} rows has an id and a text")
    result.chunks = _chunked(store, batch, rows, bounds, chunk_size, DOCUMENT_INPUT, revision)
    return result
