"""A worker's KV gate (`workers.kv_gate`): work starts while its claims fit the engine's KV
cache times the overcommit, in the whole blocks the engine hands out and within what its
requests can hold, one bigger than the cache runs alone on an idle worker, the first
request that does not fit is not passed over for ever, and an engine that reports no KV
capacity is gated by its slots alone."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from workers.engine import KvFigures
from workers.kv_gate import KvGate


def req(input_tokens: int, max_output_tokens: int):
    return SimpleNamespace(input_tokens=input_tokens, max_output_tokens=max_output_tokens)


def gate(kv: int = 1000, max_len: int = 512, overcommit: float = 1.0, queued=lambda request_id: True) -> KvGate:
    return KvGate(lambda: (kv, max_len, 0), overcommit, queued=queued)


def test_work_starts_while_its_claims_fit_the_cache():
    g = gate()
    assert g.claim(req(200, 200)) == 400 and g.claim(req(400, 400)) == 512, "capped at the max length"
    for rid in ("a", "b"):
        assert g.fits(rid, 400)
        g.started(rid, 400)
    assert not g.fits("c", 400) and g.held == 800
    g.finished("a")
    assert g.fits("c", 400)


def test_claims_count_whole_blocks_within_what_requests_can_hold():
    # vLLM's 8 blocks of 128 tokens, one its null block: requests hold 7 of them.
    engine = SimpleNamespace(kv_figures=lambda: KvFigures(capacity_tokens=1024, block_tokens=128, reserved_tokens=128),
                             max_model_len=lambda: 512)
    g = KvGate.of_engine(engine, 16, 1.0, queued=lambda request_id: True)
    assert g.admits == 896
    long, short = g.claim(req(290, 200)), g.claim(req(13, 16))
    assert (long, short) == (512, 128)
    g.started("long", long)
    assert not g.fits("another-long", long, wait=False), "980 of 1024 tokens, but 8 blocks of the 7 requests can hold"
    for rid in ("a", "b", "c"):
        assert g.fits(rid, short, wait=False)
        g.started(rid, short)
    assert not g.fits("d", short, wait=False) and g.held == 896


def test_the_overcommit_lets_more_claims_run():
    g = gate(overcommit=1.5)
    assert g.admits == 1500
    for rid in ("a", "b", "c"):
        assert g.fits(rid, 400)
        g.started(rid, 400)
    assert not g.fits("d", 400)


def test_a_request_bigger_than_the_cache_runs_alone_on_an_idle_worker():
    g = gate(kv=1000, max_len=0)
    g.started("small", 100)
    assert not g.fits("big", 1500)
    g.finished("small")
    assert g.fits("big", 1500), "idle: it runs alone, never waits for ever"
    g.started("big", 1500)
    assert not g.fits("next", 10)


def test_the_first_that_does_not_fit_is_not_passed_over_by_smaller_ones():
    g = gate()
    g.started("a", 600)
    assert not g.fits("big", 700)  # kept: from now on the others must fit beside it
    assert not g.fits("small", 100), "700 + 100 beside 600 would pass the cache"
    g.finished("a")
    assert g.fits("small", 100), "beside the big one it fits"
    assert g.fits("big", 700)
    g.started("big", 700)
    assert g.fits("small", 300) and not g.fits("other", 301)


def test_a_waiting_request_that_leaves_the_queue_holds_nothing_back():
    queue = {"big"}
    g = gate(queued=lambda request_id: request_id in queue)
    g.started("a", 600)
    assert not g.fits("big", 700)
    queue.clear()  # cancelled, or taken by another worker
    assert g.fits("small", 400)


def test_an_offer_that_does_not_fit_keeps_nothing_waiting():
    g = gate()
    g.started("a", 600)
    assert not g.fits("offered", 700, wait=False)
    assert g.fits("small", 400)


def test_an_engine_that_reports_no_kv_is_gated_by_slots_alone():
    answers = [(0, 512, 0)]
    g = KvGate(lambda: answers[0], 1.0)
    g.started("a", 10**6)
    assert g.admits == 0 and g.fits("b", 10**6)


def test_an_overcommit_of_zero_is_refused():
    with pytest.raises(ValueError, match="kv_overcommit"):
        gate(overcommit=0)
