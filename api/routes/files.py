"""`/v1/files`: OpenAI's Files API, for batch inputs and the output and error files
batches leave. Only the tenant's own files exist for it."""
from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import StreamingResponse

from api.deps import ServicesDep
from api.errors import ApiError
from api.idempotent import IdempotencyKey, once
from api.routes.batch_deps import BatchDep, BatchServicesDep, file_object, page
from models import topics
from models.events import new_event
from models.events_batch import FileDeleted
from pipelines.batch.submit import copy_upload, upload_file
from pipelines.publish import publish

router = APIRouter()
MULTIPART_SLACK = 64 * 1024  # headers and boundaries around the file part


@router.post("/v1/files")
async def create_file(request: Request, principal: BatchDep, svc: ServicesDep, bsvc: BatchServicesDep,
                      file: UploadFile = File(...), purpose: str = Form(...), idempotency_key: IdempotencyKey = None):
    limit = svc.settings.batch_max_file_bytes
    if int(request.headers.get("content-length") or 0) > limit + MULTIPART_SLACK:
        raise ApiError(413, f"the upload is larger than the limit of {limit} bytes", code="file_too_large",
                       param="file")
    fd, path = tempfile.mkstemp(prefix="ledgerlm-upload-")
    os.close(fd)
    try:
        await asyncio.to_thread(copy_upload, file.file, path)
        filename = file.filename or "upload"

        async def store() -> dict:
            return file_object(await asyncio.to_thread(
                upload_file, principal=principal, store=bsvc.store, log=svc.log, filename=filename,
                purpose=purpose, local_path=path, max_bytes=limit))
        # "The same body" of an upload: its bytes (hashed), name and purpose.
        body = {"filename": filename, "purpose": purpose,
                "content_sha256": await asyncio.to_thread(_sha256_of, path) if idempotency_key is not None else ""}
        return await once(request, svc, principal.tenant_id, idempotency_key, route="files", body=body, run=store)
    finally:
        os.remove(path)


def _sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _own_file(bsvc, principal, file_id: str):
    found = bsvc.view.file(principal.tenant_id, file_id)
    if found is None:
        raise ApiError(404, f"No such File object: {file_id}", code="file_not_found", param="file_id")
    return found


@router.get("/v1/files")
def list_files(principal: BatchDep, bsvc: BatchServicesDep, purpose: str | None = None,
               after: str | None = None, limit: int = Query(default=100, ge=1, le=10_000)):
    files = [f for f in bsvc.view.files_of(principal.tenant_id) if purpose is None or f.purpose == purpose]
    return page(files, file_object, after=after, limit=limit)


@router.get("/v1/files/{file_id}")
def get_file(file_id: str, principal: BatchDep, bsvc: BatchServicesDep):
    return file_object(_own_file(bsvc, principal, file_id))


@router.get("/v1/files/{file_id}/content", responses={200: {"description": "The file's bytes", "content": {
    "application/jsonl": {"schema": {"type": "string"}}, "application/octet-stream": {"schema": {"type": "string"}}}}})
def get_file_content(file_id: str, principal: BatchDep, bsvc: BatchServicesDep):
    found = _own_file(bsvc, principal, file_id)
    reader = bsvc.store.open_read(found.object_key)

    def chunks():
        with reader:
            while block := reader.read(1 << 20):
                yield block

    media = "application/jsonl" if found.filename.endswith(".jsonl") else "application/octet-stream"
    return StreamingResponse(chunks(), media_type=media, headers={
        "Content-Length": str(found.bytes), "Content-Disposition": f'attachment; filename="{found.filename}"'})


@router.delete("/v1/files/{file_id}")
def delete_file(file_id: str, principal: BatchDep, svc: ServicesDep, bsvc: BatchServicesDep):
    found = _own_file(bsvc, principal, file_id)
    publish(svc.log, topics.BATCHES, [new_event(FileDeleted(file_id=file_id), tenant_id=principal.tenant_id,
                                                correlation_id=file_id)])
    # The object goes after the fact is recorded; batches that read it already hold their chunks.
    bsvc.store.delete(found.object_key)
    return {"id": file_id, "object": "file", "deleted": True}
