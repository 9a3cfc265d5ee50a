"""`Idempotency-Key` on the routes that make or change objects (files, batches,
summarizations, cancels): the HTTP side of `pipelines.idempotency_keys`. A route hands
its key, a description of its body and the work; a retry gets the first answer again."""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Annotated, Awaitable, Callable

from fastapi import Header, Request

from api.deps import Services
from api.errors import ApiError
from pipelines import idempotency_keys as keys

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]
_lock = threading.Lock()
logger = logging.getLogger(__name__)


def key_book(request: Request, svc: Services) -> keys.KeyBook:
    """One book per app, made on first use (nothing connects at import time)."""
    state = request.app.state
    with _lock:
        if getattr(state, "idempotency_key_book", None) is None:
            state.idempotency_key_book = keys.KeyBook(svc.log)
    return state.idempotency_key_book


def key_reused(key: str) -> ApiError:
    return ApiError(409, f"Idempotency-Key '{key}' was already used with a different request",
                    code="idempotency_key_reused", param="Idempotency-Key")


async def once(request: Request, svc: Services, tenant_id: str, key: str | None, *, route: str, body: dict,
               run: Callable[[], Awaitable[dict]]) -> dict:
    """`run()`'s answer, or with a key already used for this body, the answer it had then."""
    if key is None:
        return await run()
    digest_key = svc.digests.key_for(tenant_id) if svc.digests is not None else None
    keyed = keys.keyed_request(tenant_id, key, route, body, digest_key)
    book = key_book(request, svc)
    try:
        began = await asyncio.to_thread(book.begin, keyed)
    except keys.KeyReused:
        raise key_reused(key) from None
    except keys.KeyInProgress:
        raise ApiError(409, f"A request with Idempotency-Key '{key}' is still in progress; retry later",
                       code="idempotency_key_in_use", param="Idempotency-Key",
                       headers={"Retry-After": "1"}) from None
    if isinstance(began, keys.Answered):
        return began.response
    try:
        answer = await run()
    except BaseException:
        try:
            await asyncio.to_thread(book.release, began)
        except Exception:  # the claim then stops holding the key after `PENDING`
            logger.warning("could not release an idempotency key claim", exc_info=True)
        raise
    await asyncio.to_thread(book.record, began, answer)
    return answer
