"""Running a chunk of summarization documents, map-reduce where a document is longer than
the model's context. Every level of every document of the chunk goes to the engine in
one call, so the engine batches across documents. The plan (`models.summarization`) is
the one the dispatcher reserved budget for, so usage never exceeds the reservation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from models.summarization import Shape, groups, plan, split_even
from pipelines.batch.tokens import TemplateIds
from workers.batch_engine import BatchEngine, GenRequest, GenResult


@dataclass
class _Doc:
    row: int
    doc_id: str
    items: list[list[int]]  # content of the next calls: slices of the text, then joined summaries
    input_tokens: int = 0
    output_tokens: int = 0
    map_reduce: bool = False
    summary: str | None = None
    finish_reason: str | None = None
    error: str | None = None
    levels: int = 0
    outputs: list[GenResult] = field(default_factory=list)


def summarize_documents(docs: list[dict], *, engine: BatchEngine, tenant_id: str, tids: TemplateIds, shape: Shape,
                        temperature: float, model_revision: str) -> tuple[list[dict], int]:
    """Rows of the documented output schema, and how many documents went map-reduce."""
    work = []
    for doc in docs:
        ids = list(doc["text_token_ids"])
        doc_plan = plan(len(ids), shape)
        work.append(_Doc(doc["row"], doc["id"], split_even(ids, doc_plan.pieces), map_reduce=doc_plan.map_reduce))
    while active := [d for d in work if d.items and d.error is None]:
        calls = [(d, content) for d in active for content in d.items]
        results = engine.generate(
            [GenRequest(tids.prompt(content), shape.max_output_tokens, temperature=temperature)
             for _, content in calls], tenant_id=tenant_id)
        for d in active:
            d.outputs = []
        for (d, _), result in zip(calls, results):
            d.input_tokens += result.prompt_tokens
            d.output_tokens += len(result.token_ids)
            d.outputs.append(result)
        for d in active:
            _advance(d, tids, shape)
    rows = [{"id": d.doc_id, "summary": d.summary, "input_tokens": d.input_tokens, "output_tokens": d.output_tokens,
             "finish_reason": d.finish_reason, "model_revision": model_revision, "error": d.error} for d in work]
    return rows, sum(1 for d in work if d.map_reduce)


def _advance(d: _Doc, tids: TemplateIds, shape: Shape) -> None:
    d.levels += 1
    failed = next((r.error for r in d.outputs if r.error), None)
    if failed:
        d.error, d.items = f"invalid_request: {failed}", []
        return
    if len(d.outputs) == 1:
        d.summary, d.finish_reason, d.items = d.outputs[0].text, d.outputs[0].finish_reason, []
        return
    # Reduce: join the summaries' own tokens, `group` at a time, with the separator between.
    joined = []
    for group in groups([r.token_ids for r in d.outputs], shape.group):
        content: list[int] = []
        for i, ids in enumerate(group):
            content += ([*tids.sep] if i else []) + list(ids)
        joined.append(content)
    d.items = joined
