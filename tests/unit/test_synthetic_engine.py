"""The stand-in engine of the data-plane benchmark: its rate, its seats and its aborts."""
from __future__ import annotations

import asyncio
import time

import pytest

from workers.engine import EngineRequest
from workers.synthetic_engine import SyntheticEngine


def _request(rid: str, tokens: int) -> EngineRequest:
    return EngineRequest(request_id=rid, prompt="p", max_output_tokens=tokens, tenant_id="t")


async def _drain(engine, rid, tokens):
    deltas = [d async for d in engine.generate(_request(rid, tokens))]
    return deltas


def test_every_stream_gets_a_token_a_step_at_the_set_rate():
    async def run():
        engine = SyntheticEngine(tokens_per_s=100.0, max_seqs=64)
        began = time.monotonic()
        results = await asyncio.gather(*(_drain(engine, f"r{i}", 10) for i in range(32)))
        return engine, time.monotonic() - began, results

    engine, took, results = asyncio.run(run())
    for deltas in results:
        assert [d.output_tokens for d in deltas] == list(range(1, 11))
        assert deltas[-1].finished and deltas[-1].finish_reason == "length"
        assert "".join(d.text for d in deltas).split() == ["tok"] * 10
    # 32 streams of 10 tokens ran side by side: about 10 steps of 10 ms, not 320.
    assert 10 <= engine.steps <= 14
    assert took >= 0.09


def test_streams_past_the_seats_wait_for_a_free_one():
    async def run():
        engine = SyntheticEngine(tokens_per_s=200.0, max_seqs=2)
        await asyncio.gather(*(_drain(engine, f"r{i}", 5) for i in range(4)))
        return engine.steps

    steps = asyncio.run(run())
    assert steps >= 10  # two rounds of 5 steps: the last two waited for seats


def test_abort_ends_a_stream_early_and_unknown_ids_are_ignored():
    async def run():
        engine = SyntheticEngine(tokens_per_s=100.0, max_seqs=1)
        got = []

        async def consume(rid):
            async for d in engine.generate(_request(rid, 1000)):
                got.append((rid, d))
                if rid == "a" and d.output_tokens == 2:
                    await engine.abort("a")
                    await engine.abort("nobody")

        waiting = asyncio.ensure_future(consume("b"))  # waits for a's seat
        await asyncio.sleep(0)
        await engine.abort("b")
        await consume("a")
        await waiting
        return got

    got = asyncio.run(run())
    ends = {rid: d for rid, d in got if d.finished}
    assert ends["a"].finish_reason == "abort" and ends["a"].output_tokens == 2
    assert ends["b"].finish_reason == "abort" and ends["b"].output_tokens == 0


def test_a_rate_of_zero_is_refused():
    with pytest.raises(ValueError):
        SyntheticEngine(tokens_per_s=0)
