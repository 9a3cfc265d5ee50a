"""The test engine of known speed: an aborted request ends at once as aborted, and the same
request id started again afterwards (a take that failed and was taken again) runs in full,
as on vLLM, which keeps nothing of an aborted request."""
from __future__ import annotations

import asyncio

from tests.slow_engine import SlowEngine
from workers.engine import EngineRequest


def run(engine: SlowEngine, request: EngineRequest, abort_after: int | None = None) -> list:
    async def go():
        deltas = []
        async for delta in engine.generate(request):
            deltas.append(delta)
            if abort_after is not None and len(deltas) == abort_after:
                await engine.abort(request.request_id)
        return deltas
    return asyncio.run(go())


def test_an_aborted_request_id_started_again_runs_in_full():
    engine = SlowEngine(0.001)
    request = EngineRequest(request_id="r1", prompt="hi", max_output_tokens=5, tenant_id="t")
    first = run(engine, request, abort_after=2)
    assert first[-1].finished and first[-1].finish_reason == "abort" and len(first) == 3
    again = run(engine, request)
    assert [d.finish_reason for d in again][-1] == "length" and sum(d.new_tokens for d in again) == 5
