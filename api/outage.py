"""The API when the log or admission does not answer: a prompt 503, never a hang or a 500.

- Every call to the log is bounded (the API's Kafka handle waits at most
  `decision_timeout_s` per call, see `api.app.build_services`), and a transient error of the
  log or database that reaches a route is answered 503 `log_unavailable` with Retry-After,
  in the OpenAI error shape (`install`). Once the log is known to be away (`api.log_watch`),
  a request that would write to it is answered so at once.
- A generation with no decision from admission within `decision_timeout_s` is answered 503
  `admission_timeout` (`decided` tells a request admission has decided but no worker has
  started yet, which keeps waiting, from one it has not seen).
- A request the client was told failed may still reach the log (a Kafka producer sends what
  it buffered once the broker is back) or be decided later: `abandon` appends a cancel for
  it, retried until the log takes it, so whatever is reserved for it is released (the
  worker that would take it ends it as cancelled, and admission settles that).
"""
from __future__ import annotations

import asyncio
import logging
import sqlite3
import sys
import time

from fastapi import FastAPI, Request

from api.errors import ApiError, error_response
from models import topics
from models.events import new_event
from models.events_generation import CancelRequested
from pipelines.eventlog import EventLogError
from pipelines.outage import Backoff, is_transient
from pipelines.publish import publish

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5  # about how long a broker restart or a leader election takes
ABANDON_FOR_S = 600.0  # how long a cancel for an abandoned request is retried while the log is down
_abandoning: set[asyncio.Task] = set()  # kept referenced until done (asyncio holds tasks weakly)


def log_unavailable(what: str = "The event log") -> ApiError:
    return ApiError(503, f"{what} is unavailable; try again shortly", code="log_unavailable",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


def admission_timeout(timeout_s: float) -> ApiError:
    return ApiError(503, f"The request was not admitted within {timeout_s:g} s; it was cancelled, try again "
                    "shortly", code="admission_timeout", headers={"Retry-After": str(RETRY_AFTER_S)})


def install(app: FastAPI) -> None:
    """Answers transient errors of the log or the database 503 in the OpenAI shape; any
    other error of those classes goes on as before."""
    classes: list[type[BaseException]] = [EventLogError, TimeoutError, ConnectionError, sqlite3.OperationalError]
    kafka_errors = sys.modules.get("kafka.errors")  # only where this process talks to Kafka
    if kafka_errors is not None:
        classes.append(kafka_errors.KafkaError)
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is not None:
        classes.append(sa_exc.SQLAlchemyError)

    async def _unavailable(request: Request, exc: Exception):
        if not is_transient(exc):
            raise exc
        logger.warning("answering 503: %r", exc)
        watch = getattr(request.app.state.services, "log_watch", None)
        if watch is not None:
            watch.failed(exc)
        return error_response(503, "A backing service (the event log or the database) is unavailable; try again "
                              "shortly", "log_unavailable", None, {"Retry-After": str(RETRY_AFTER_S)})

    for cls in classes:
        app.add_exception_handler(cls, _unavailable)


async def within(awaitable: asyncio.Future, until: float, what: str, watch=None):
    """The result of `awaitable` (left running if it is late), or 503 `log_unavailable` when
    it is not done by `until` (monotonic) or fails on a transient error, which `watch` (the
    API's `LogWatch`, if given) is told of."""
    try:
        return await asyncio.wait_for(asyncio.shield(awaitable), max(0.05, until - time.monotonic()))
    except asyncio.TimeoutError:
        if watch is not None:
            watch.failed(f"{what} did not answer in time")
        raise log_unavailable(what) from None
    except Exception as exc:
        if is_transient(exc):
            if watch is not None:
                watch.failed(exc)
            raise log_unavailable(what) from exc
        raise


async def decided(svc, tenant_id: str, request_id: str, *, timeout_s: float) -> bool:
    """Whether admission has decided the request (it is queued, running, rejected or over),
    as the log says within `timeout_s`; False when the log does not say in time."""
    lookup = asyncio.ensure_future(asyncio.to_thread(svc.index.status, tenant_id, request_id))
    try:
        row = await asyncio.wait_for(asyncio.shield(lookup), timeout_s)
    except asyncio.TimeoutError:
        lookup.add_done_callback(_quiet)
        return False
    except Exception as exc:
        if not is_transient(exc):
            raise
        return False
    return row is not None and row.get("status") not in (None, "requested")


def abandon(svc, tenant_id: str, request_id: str, submitting: asyncio.Future | None = None) -> None:
    """Cancels a request its client was told failed, in the background: after its submission
    (`submitting`, if still under way) has ended, then retried until the log takes it."""
    task = asyncio.get_running_loop().create_task(_cancel(svc, tenant_id, request_id, submitting))
    _abandoning.add(task)
    task.add_done_callback(_abandoning.discard)


async def _cancel(svc, tenant_id: str, request_id: str, submitting: asyncio.Future | None) -> None:
    if submitting is not None:
        try:
            await asyncio.wait_for(asyncio.shield(submitting), ABANDON_FOR_S)
        except Exception as exc:  # noqa: BLE001 - a refusal (4xx) appended nothing: nothing to cancel
            if not is_transient(exc) and not isinstance(exc, asyncio.TimeoutError):
                return
    env = new_event(CancelRequested(request_id=request_id, reason="client_gone"), tenant_id=tenant_id,
                    correlation_id=request_id)
    backoff, give_up = Backoff(), time.monotonic() + ABANDON_FOR_S
    while True:
        try:
            await asyncio.to_thread(publish, svc.log, topics.REQUESTS, [env])
            logger.info("request %s was answered 503; cancel appended", request_id)
            return
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() > give_up:
                logger.error("request %s was answered 503, and its cancel could not be appended (%r); a "
                             "reservation made for it settles when it ends or expires", request_id, exc)
                return
            await asyncio.sleep(backoff.next())


def _quiet(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: a late lookup's failure is nobody's business


async def aclose() -> None:
    """Stops retrying cancels (at shutdown)."""
    mine = [t for t in _abandoning if t.get_loop() is asyncio.get_running_loop()]
    for task in mine:
        task.cancel()
    await asyncio.gather(*mine, return_exceptions=True)
