"""`/v1/batches`: OpenAI's Batch API. Requests are translated into commands of
`pipelines.batch.submit`; the batch's progress is the dispatcher's, read from the log."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from api.deps import ServicesDep
from api.errors import ApiError
from api.idempotent import IdempotencyKey, once
from api.routes.batch_deps import BatchDep, BatchServicesDep, batch_object, page
from pipelines.batch.submit import SubmitBatch, cancel_batch, submit_batch

router = APIRouter()


class BatchBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input_file_id: str = Field(min_length=1, max_length=128)
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None


@router.post("/v1/batches")
async def create_batch(body: BatchBody, principal: BatchDep, svc: ServicesDep, bsvc: BatchServicesDep,
                       request: Request, idempotency_key: IdempotencyKey = None):
    cmd = SubmitBatch(input_file_id=body.input_file_id, endpoint=body.endpoint,
                      completion_window=body.completion_window, metadata=body.metadata or {})

    async def submit() -> dict:
        return batch_object(await asyncio.to_thread(submit_batch, cmd, principal=principal, view=bsvc.view,
                                                    store=bsvc.store, log=svc.log))
    return await once(request, svc, principal.tenant_id, idempotency_key, route="batches",
                      body=body.model_dump(mode="json"), run=submit)


def _own_batch(bsvc, principal, batch_id: str):
    batch = bsvc.view.batch(principal.tenant_id, batch_id)
    if batch is None or batch.summarization is not None:
        raise ApiError(404, f"No such batch: {batch_id}", code="batch_not_found", param="batch_id")
    return batch


@router.get("/v1/batches/{batch_id}")
def get_batch(batch_id: str, principal: BatchDep, bsvc: BatchServicesDep):
    return batch_object(_own_batch(bsvc, principal, batch_id))


@router.get("/v1/batches")
def list_batches(principal: BatchDep, bsvc: BatchServicesDep, after: str | None = None,
                 limit: int = Query(default=20, ge=1, le=100)):
    batches = [b for b in bsvc.view.batches_of(principal.tenant_id) if b.summarization is None]
    return page(batches, batch_object, after=after, limit=limit)


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel(batch_id: str, principal: BatchDep, svc: ServicesDep, bsvc: BatchServicesDep, request: Request,
                 idempotency_key: IdempotencyKey = None):
    def cancelled() -> dict:
        _own_batch(bsvc, principal, batch_id)
        return batch_object(cancel_batch(batch_id, principal=principal, view=bsvc.view, log=svc.log))
    return await once(request, svc, principal.tenant_id, idempotency_key, route="batches.cancel",
                      body={"batch_id": batch_id}, run=lambda: asyncio.to_thread(cancelled))
