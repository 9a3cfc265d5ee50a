"""Clients that go away: noticing it, and cancelling their generation after a grace.

The grace lets a client that lost its connection come back (`GET .../events` with
`Last-Event-ID`) without losing the generation: if, when it is over, the request has
ended or someone in this process is streaming it again, nothing is cancelled. What the
client had received is recorded in every case it went away early: on the cancel, or, for
a generation that ended inside the grace, as `OutputDelivered`.
"""
from __future__ import annotations

import asyncio
import logging

from fastapi import Request

from api.errors import ClientGone
from api.metrics import ApiMetrics
from api.request_stream import RequestStream, StreamTimeout
from api.stream_hub import StreamHub
from models import topics
from models.events import new_event
from models.events_generation import CancelRequested, OutputDelivered
from pipelines.eventlog import EventLog
from pipelines.publish import publish

logger = logging.getLogger(__name__)


async def until_disconnected(request: Request) -> None:
    # The body is read by now, so the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(awaitable, request: Request):
    """The result of `awaitable`, or `ClientGone` if the client leaves first."""
    work = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(until_disconnected(request))
    try:
        done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if work in done:
        return work.result()
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    raise ClientGone()


class DisconnectReaper:
    def __init__(self, log: EventLog, hub: StreamHub, metrics: ApiMetrics, *, grace_s: float):
        self._log, self._hub, self._metrics, self.grace_s = log, hub, metrics, grace_s
        self._tasks: set[asyncio.Task] = set()

    def client_gone(self, stream: RequestStream, *, delivered: int | None = None) -> None:
        """Takes over `stream` (and closes it). Safe to call from a cancelled task: the
        waiting happens in a task of its own. `delivered`: the output tokens the client got
        (by default, what the stream had handed out: the reaper reads on from there)."""
        delivered = stream.tokens_out if delivered is None else delivered
        task = asyncio.get_running_loop().create_task(self._reap(stream, delivered))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reap(self, stream: RequestStream, delivered: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        try:
            while not stream.ended:
                await stream.next(deadline - loop.time())
        except StreamTimeout:
            pass
        finally:
            stream.close()
        if self._hub.subscribers(stream.tenant_id, stream.request_id):
            return  # streamed again: that stream's own end decides
        if stream.ended:
            # It ended inside the grace: nothing to cancel, but the client did not get it all.
            if delivered < stream.tokens_out:
                payload = OutputDelivered(request_id=stream.request_id, delivered_output_tokens=delivered)
                await self._publish(stream, payload)
            return
        await self._publish(stream, CancelRequested(request_id=stream.request_id, reason="client_gone",
                                                    delivered_output_tokens=delivered))
        self._metrics.client_gone.inc()
        logger.info("client of %s went away; cancel requested", stream.request_id)

    async def _publish(self, stream: RequestStream, payload) -> None:
        env = new_event(payload, tenant_id=stream.tenant_id, correlation_id=stream.request_id)
        await asyncio.to_thread(publish, self._log, topics.REQUESTS, [env])

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
