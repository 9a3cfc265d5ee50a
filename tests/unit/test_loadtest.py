"""`ledgerlm loadtest` without I/O: the workload's distributions and arrival processes do
what the file asks, figures keep rejections apart from failures, and a sweep's knee."""
from __future__ import annotations

import json
import random
import statistics

import pytest

from api.loadtest import report, steps_of
from api.loadtest.driver import Timed, _finish, body, endpoint
from api.loadtest.workload import Arrivals, Lengths, Slo, WorkloadError, parse


def gaps_of(offsets: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *offsets], offsets)]


def test_poisson_arrivals_keep_the_rate_with_exponential_gaps():
    offsets = Arrivals("poisson").offsets(50.0, 200.0, random.Random(1))
    assert len(offsets) == pytest.approx(10_000, rel=0.03)
    gaps = gaps_of(offsets)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.05)


def test_gamma_arrivals_keep_the_rate_and_come_in_bursts():
    offsets = Arrivals("gamma", cv=3.0).offsets(50.0, 800.0, random.Random(2))
    assert len(offsets) == pytest.approx(40_000, rel=0.05)
    gaps = gaps_of(offsets)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(3.0, rel=0.15)


def test_a_step_burst_multiplies_the_rate_in_its_window_only():
    offsets = Arrivals("step", burst_at_s=100.0, burst_s=50.0, factor=4.0).offsets(20.0, 200.0, random.Random(3))
    inside = sum(100.0 <= t < 150.0 for t in offsets)
    assert inside == pytest.approx(4 * 20 * 50, rel=0.06)
    assert len(offsets) - inside == pytest.approx(20 * 150, rel=0.06)


def test_lognormal_lengths_have_their_median_and_a_fat_tail():
    spec = Lengths(dist="lognormal", median=100, sigma=1.0, min=1, max=1_000_000)
    rng = random.Random(4)
    values = sorted(spec.sample(rng) for _ in range(20_000))
    median, p99 = values[10_000], values[19_800]
    assert median == pytest.approx(100, rel=0.05)
    assert p99 / median > 7  # e^(2.33 sigma) ~ 10: the tail a fixed or uniform length lacks


def test_lengths_are_clipped_and_uniform_stays_in_range():
    rng = random.Random(5)
    clipped = Lengths(dist="lognormal", median=100, sigma=2.0, min=10, max=300)
    assert all(10 <= clipped.sample(rng) <= 300 for _ in range(2000))
    uniform = Lengths(dist="uniform", min=3, max=7)
    assert {uniform.sample(rng) for _ in range(500)} == {3, 4, 5, 6, 7}


def test_a_trace_is_replayed_in_order(tmp_path):
    (tmp_path / "trace.jsonl").write_text("\n".join(json.dumps({"prompt_tokens": p, "output_tokens": o})
                                                    for p, o in ((10, 5), (200, 7), (35, 9))))
    w = parse({"prompt_tokens": {"dist": "trace", "file": "trace.jsonl"},
               "output_tokens": {"dist": "trace", "file": "trace.jsonl"}}, tmp_path)
    reqs = w.requests(random.Random(6))
    got = [(r.prompt_tokens, r.max_tokens) for r in (next(reqs) for _ in range(4))]
    assert got == [(10, 5), (200, 7), (35, 9), (10, 5)]


def test_tenant_shares_and_cacheable_repeats():
    w = parse({"tenants": [{"name": "a", "api_key": "ka", "share": 7}, {"name": "b", "api_key": "kb", "share": 3}],
               "prompt_tokens": 20, "cacheable_repeat": 0.3})
    reqs = w.requests(random.Random(7))
    sample = [next(reqs) for _ in range(10_000)]
    assert sum(r.tenant.name == "a" for r in sample) / len(sample) == pytest.approx(0.7, abs=0.02)
    assert sum(r.repeat for r in sample) / len(sample) == pytest.approx(0.3, abs=0.02)
    fresh = {r.tenant.name: set() for r in sample}
    for r in sample:
        if r.repeat:  # the same text as an earlier prompt of the same tenant: a prefix-cache hit
            assert r.prompt in fresh[r.tenant.name]
        else:
            assert r.prompt not in fresh[r.tenant.name]
            fresh[r.tenant.name].add(r.prompt)
    assert len(sample[0].prompt.split()) == 20


@pytest.mark.parametrize("spec", [{"prompt_tokens": {"dist": "zipf"}}, {"arrival": {"process": "hawkes"}},
                                  {"mode": {"kind": "spike"}}, {"tenants": [{"name": "a", "share": 0}]},
                                  {"api": "responses"}])
def test_a_workload_it_cannot_run_is_refused(spec):
    with pytest.raises(WorkloadError):
        parse(spec)


def test_modes_to_steps():
    w = parse({"mode": {"kind": "sweep", "rates": [4, 1, 2]}})
    assert steps_of(w.mode) == [("rate", 1.0, None), ("rate", 2.0, None), ("rate", 4.0, None)]
    assert steps_of(parse({"mode": {"kind": "concurrency", "concurrency": 3}}).mode) == [("concurrency", None, 3)]
    with pytest.raises(WorkloadError):
        steps_of(parse({"mode": {"kind": "rate"}}).mode)


def test_request_bodies_and_routes():
    w = parse({"model": "tiny", "api": "completions", "stream": True})
    req = next(w.requests(random.Random(8)))
    sent = body(w, req)
    assert sent["prompt"] == req.prompt and sent["max_tokens"] == req.max_tokens and sent["ignore_eos"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert endpoint("http://h:1/v1/", "chat") == "http://h:1/v1/chat/completions"
    assert endpoint("http://h:1", "completions") == "http://h:1/v1/completions"


def test_chunks_carrying_several_tokens_count_as_that_many_gaps():
    # 9 tokens in 3 chunks: first at 0.1 s, then 0.2 s and 0.3 s; usage says 9.
    t = _finish(Timed(tenant="a"), 0.0, 0.3, [0.1, 0.2, 0.3], {"completion_tokens": 9, "prompt_tokens": 4})
    assert t.ttft_ms == pytest.approx(100) and t.e2e_ms == pytest.approx(300)
    assert t.tpot_ms == pytest.approx(200 / 8)
    assert t.itl_ms == pytest.approx([25.0, 25.0])  # each 100 ms gap carried 4 tokens
    assert (t.output_tokens, t.prompt_tokens) == (9, 4)


def ok(tenant: str, ttft: float, tpot: float, tokens: int = 10) -> Timed:
    return Timed(tenant=tenant, ttft_ms=ttft, tpot_ms=tpot, e2e_ms=ttft + tpot * (tokens - 1), output_tokens=tokens,
                 itl_ms=[tpot] * (tokens - 1))


def test_figures_keep_rejections_apart_and_count_goodput_by_slo():
    slo = Slo(ttft_p95_ms=100, tpot_p95_ms=20)
    timed = ([ok("a", 50, 10)] * 6 + [ok("a", 150, 10)] * 2 + [ok("b", 50, 30)] * 2
             + [Timed(tenant="b", outcome="rejected", reason="rate")] * 3
             + [Timed(tenant="b", outcome="rejected", reason="shed")]
             + [Timed(tenant="a", outcome="failed", reason="engine_error")])
    fig = report.figures(timed, 2.0, slo)
    assert (fig["requests"], fig["served"]) == (15, 10)
    assert fig["rejections"] == {"rate": 3, "shed": 1} and fig["failures"] == 1
    assert fig["failures_by_reason"] == {"engine_error": 1}
    assert fig["requests_per_s"] == 5.0 and fig["output_tokens_per_s"] == 50.0
    assert fig["goodput_requests_per_s"] == 3.0 and fig["goodput_output_tokens_per_s"] == 30.0
    assert fig["ttft_ms"]["p50"] == 50.0 and fig["ttft_ms"]["p99"] > 140
    assert not report.meets(fig, slo)  # TTFT p95 150 > 100, and a third of the requests went unserved
    assert report.meets(report.figures([ok("a", 50, 10)] * 20, 1.0, slo), slo)


def step(tokens_per_s: float, meets_slo: bool = True) -> dict:
    return {"output_tokens_per_s": tokens_per_s, "meets_slo": meets_slo}


def test_the_knee_is_the_last_step_before_the_slo_breaks_or_throughput_stops_rising():
    # Steps count from 1, as the table, the CSV and `ledgerlm capacity plan` count them.
    assert report.find_knee([step(100), step(200), step(250, False)], 0.05) == (2, "slo broken at step 3")
    assert report.find_knee([step(100), step(200), step(205), step(300)], 0.05) == \
        (2, "throughput stopped rising at step 3")
    assert report.find_knee([step(100), step(200)], 0.05) == (2, "sweep ended")
    assert report.find_knee([step(100, False)], 0.05) == (None, "slo broken at step 1")


def test_the_knee_step_of_a_result_numbered_from_1_and_of_an_older_one_from_0():
    steps = [{"step": n, "rate": float(n)} for n in (1, 2, 3)]
    assert report.knee_step({"knee": 2, "steps": steps})["rate"] == 2.0
    assert report.knee_step({"knee": None, "steps": steps}) is None
    older = [{"rate": float(n)} for n in (1, 2, 3)]  # written before steps carried their number
    assert report.knee_step({"knee": 2, "steps": older})["rate"] == 3.0
    assert report.knee_step({"knee": 7, "steps": steps}) is None


def test_the_cli_registers_loadtest():
    import argparse

    from api.cli.main import build_parser
    from api.cli.loadtest import apply_options, register

    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    register(verbs)
    args = parser.parse_args(["loadtest", "w.yaml", "--target", "http://x", "--sweep-rates", "1,2,4",
                              "--duration", "5", "--replicas", "3"])
    w = parse({"mode": {"kind": "rate", "rate": 9}})
    apply_options(w, args)
    assert (w.mode.kind, w.mode.rates, w.mode.duration_s, args.replicas) == ("sweep", [1.0, 2.0, 4.0], 5.0, 3)
    with pytest.raises(SystemExit):
        parser.parse_args(["loadtest", "w.yaml", "--target", "http://x", "--sweep-rates", "1,-2"])


def test_guidellms_fit_finds_the_same_knee_on_a_clear_curve():
    # Offered 2, 4, ... 16 requests/s to a server that serves 10 at most.
    steps = [{"served": 1, "mode": "rate", "rate": float(r), "output_tokens_per_s": 16 * min(r, 10)}
             for r in (2, 4, 6, 8, 10, 12, 14, 16)]
    fit = report.knee_fit(steps)
    assert fit["status"] == "ok" and fit["load"] == pytest.approx(10, abs=1.5)
    assert report.knee_fit(steps[:4]) is None  # too few points for a segmented fit
