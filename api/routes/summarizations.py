"""`/v1/summarizations`: summarize many documents offline. The input is a Parquet or
JSONL file with columns `id` and `text`, uploaded (`input_file_id`) or already in the
object store under the tenant's own prefix (`input_url`). The output is a Parquet
dataset (`data_uri`) with `id, summary, input_tokens, output_tokens, finish_reason,
model_revision, error`, plus a `manifest.json`; documents longer than the model's
context are summarized map-reduce style. Once the job ends, `/output` lists its Parquet
parts and `/output/{name}` serves each one's bytes."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from api.deps import ServicesDep
from api.errors import ApiError
from api.idempotent import IdempotencyKey, once
from api.routes.batch_deps import BatchDep, BatchServicesDep, page, summarization_object
from pipelines.batch.output import open_part, output_parts
from pipelines.batch.submit import SubmitSummarization, cancel_batch, submit_summarization

router = APIRouter()
DEFAULT_TEMPLATE = "Summarize the following text.\n\n{text}\n\nSummary:"


class SummarizationBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=128)
    input_file_id: str | None = None
    input_url: str | None = Field(default=None, max_length=2048)
    prompt_template: str = Field(default=DEFAULT_TEMPLATE, min_length=6, max_length=16_384)
    max_output_tokens: int = Field(default=128, gt=0, le=100_000)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    metadata: dict[str, str] | None = None


@router.post("/v1/summarizations")
async def create_summarization(body: SummarizationBody, principal: BatchDep, svc: ServicesDep,
                               bsvc: BatchServicesDep, request: Request, idempotency_key: IdempotencyKey = None):
    cmd = SubmitSummarization(model=body.model, prompt_template=body.prompt_template,
                              max_output_tokens=body.max_output_tokens, input_file_id=body.input_file_id,
                              input_url=body.input_url, temperature=body.temperature, metadata=body.metadata or {})

    async def submit() -> dict:
        job = await asyncio.to_thread(
            submit_summarization, cmd, principal=principal, registry=svc.registry_view.refresh(), view=bsvc.view,
            store=bsvc.store, log=svc.log, max_bytes=svc.settings.batch_max_file_bytes)
        return summarization_object(job, bsvc.store)
    return await once(request, svc, principal.tenant_id, idempotency_key, route="summarizations",
                      body=body.model_dump(mode="json"), run=submit)


def _own_job(bsvc, principal, job_id: str):
    job = bsvc.view.batch(principal.tenant_id, job_id)
    if job is None or job.summarization is None:
        raise ApiError(404, f"No such summarization: {job_id}", code="not_found", param="summarization_id")
    return job


@router.get("/v1/summarizations/{job_id}")
def get_summarization(job_id: str, principal: BatchDep, bsvc: BatchServicesDep):
    return summarization_object(_own_job(bsvc, principal, job_id), bsvc.store)


@router.get("/v1/summarizations")
def list_summarizations(principal: BatchDep, bsvc: BatchServicesDep, after: str | None = None,
                        limit: int = Query(default=20, ge=1, le=100)):
    jobs = [b for b in bsvc.view.batches_of(principal.tenant_id) if b.summarization is not None]
    return page(jobs, lambda b: summarization_object(b, bsvc.store), after=after, limit=limit)


@router.post("/v1/summarizations/{job_id}/cancel")
async def cancel(job_id: str, principal: BatchDep, svc: ServicesDep, bsvc: BatchServicesDep, request: Request,
                 idempotency_key: IdempotencyKey = None):
    def cancelled() -> dict:
        _own_job(bsvc, principal, job_id)
        job = cancel_batch(job_id, principal=principal, view=bsvc.view, log=svc.log, kind="summarization")
        return summarization_object(job, bsvc.store)
    return await once(request, svc, principal.tenant_id, idempotency_key, route="summarizations.cancel",
                      body={"summarization_id": job_id}, run=lambda: asyncio.to_thread(cancelled))


@router.get("/v1/summarizations/{job_id}/output")
def list_output(job_id: str, principal: BatchDep, bsvc: BatchServicesDep):
    manifest, parts = output_parts(_own_job(bsvc, principal, job_id), bsvc.store)
    return {"object": "list", "manifest": manifest, "data": [
        {"object": "summarization.output_part", "name": p.name, "rows": p.rows, "bytes": p.bytes,
         "url": f"/v1/summarizations/{job_id}/output/{p.name}"} for p in parts]}


@router.get("/v1/summarizations/{job_id}/output/{name}", responses={200: {"description": "The part's bytes",
            "content": {"application/vnd.apache.parquet": {"schema": {"type": "string"}}}}})
def get_output_part(job_id: str, name: str, principal: BatchDep, bsvc: BatchServicesDep):
    part, reader = open_part(_own_job(bsvc, principal, job_id), bsvc.store, name)

    def chunks():
        with reader:
            while block := reader.read(1 << 20):
                yield block

    return StreamingResponse(chunks(), media_type="application/vnd.apache.parquet", headers={
        "Content-Length": str(part.bytes), "Content-Disposition": f'attachment; filename="{part.name}"'})
