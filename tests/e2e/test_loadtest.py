"""`ledgerlm loadtest` against an endpoint of known speed (tests/fake_openai.py): the
figures it reports are what the endpoint was set to do — the rate it was asked to send,
the TTFT and token gap the server was given, the output tokens, rejections by reason
apart from failures, and the knee of a server that saturates at a known concurrency."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from api.loadtest import parse, run
from tests.fake_openai import FakeOpenAI, serve
from tests.harness import MODEL_ALIAS

pytestmark = pytest.mark.timing


def workload(**overrides) -> dict:
    spec = {"model": "fake", "api": "chat", "stream": True, "seed": 11,
            "tenants": [{"name": "steady", "api_key": "key-steady", "share": 3},
                        {"name": "limited", "api_key": "key-limited", "share": 1}],
            "prompt_tokens": {"dist": "lognormal", "median": 30, "sigma": 1.0, "max": 400},
            "output_tokens": 10, "slo": {"ttft_p95_ms": 1000, "tpot_p95_ms": 100}}
    spec.update(overrides)
    return spec


def loadtest(spec: dict, url: str, out: Path, *options: str, name: str = "fake") -> dict:
    """`ledgerlm loadtest` run in a process of its own, as a user runs it (the test process's
    threads would take time from its sending); returns the result file it wrote."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "api.cli", "loadtest", str(path), "--target", url, "--name", name,
                           "--out", str(out), "--no-progress", *options], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((out / f"{name}.json").read_text())


def test_a_fixed_rate_run_reports_the_rate_ttft_tokens_and_rejections(tmp_path):
    fake = FakeOpenAI(ttft_s=0.2, itl_s=0.01, reject={"key-limited": "rate"})
    with serve(fake) as url:
        result = loadtest(workload(mode={"kind": "rate", "rate": 25, "duration_s": 4}), url, tmp_path / "out",
                          "--replicas", "2")
    assert (result["target"], result["model"], result["replicas"], result["knee"]) == ("fake", "fake", 2, None)
    assert result["slo"]["ttft_p95_ms"] == 1000 and result["slo"]["tpot_p95_ms"] == 100
    [s] = result["steps"]
    figures = {"requests", "requests_per_s", "output_tokens_per_s", "goodput_requests_per_s",
               "goodput_output_tokens_per_s", "meets_slo", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "rejections",
               "failures"}
    assert figures | {"mode", "rate", "concurrency", "duration_s", "per_tenant"} <= set(s)  # what the planner reads
    assert all(figures <= set(t) for t in s["per_tenant"].values())
    assert set(s["tpot_ms"]) == {"p50", "p95", "p99"}
    assert (s["mode"], s["rate"], s["concurrency"]) == ("rate", 25.0, None)
    # Poisson at 25/s for 4 s: 100 expected, standard deviation 10.
    assert 60 <= s["requests"] <= 140
    assert s["requests"] == len(fake.received)
    assert s["offered_rate"] == pytest.approx(25, abs=10)
    assert s["client_send_lag_ms"]["p95"] < 100, "the client sent late: its own delay would skew the rate"
    steady, limited = s["per_tenant"]["steady"], s["per_tenant"]["limited"]
    assert steady["requests"] + limited["requests"] == s["requests"] and limited["requests"] > 5
    # Rejections by reason, apart from failures, and only for the tenant the server refused.
    assert s["rejections"] == {"rate": limited["requests"]} and limited["rejections"] == {"rate": limited["requests"]}
    assert s["failures"] == 0 and steady["rejections"] == {} and steady["served"] == steady["requests"]
    assert limited["goodput_requests_per_s"] == 0 and limited["ttft_ms"]["p50"] is None
    # The server's TTFT (after a role-only chunk sent at once) and its 10 ms token gap.
    assert 200 <= s["ttft_ms"]["p50"] <= 270
    assert 9.5 <= s["tpot_ms"]["p50"] <= 14 and 9.0 <= s["itl_ms"]["p50"] <= 14
    assert steady["output_tokens_mean"] == 10
    assert s["output_tokens_per_s"] == pytest.approx(steady["served"] * 10 / s["duration_s"], rel=1e-3)
    assert s["goodput_requests_per_s"] == pytest.approx(steady["served"] / s["duration_s"], rel=1e-3)
    assert s["client_cpu_ms_per_request"] > 0
    # A quarter of the requests refused: the step does not meet the SLO however fast the rest were.
    assert s["meets_slo"] is False and steady["meets_slo"] is True
    csv_rows = (tmp_path / "out" / "fake.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + 3 and csv_rows[1].startswith("1,*,rate")
    assert (tmp_path / "out" / "fake-frontier.png").stat().st_size > 10_000


def test_multi_token_chunks_and_whole_responses_give_the_same_tokens(tmp_path):
    fake = FakeOpenAI(ttft_s=0.1, itl_s=0.01, tokens_per_chunk=4)
    with serve(fake) as url:
        spec = workload(tenants=[{"name": "a", "api_key": "k"}], output_tokens=17, api="completions",
                        mode={"kind": "concurrency", "concurrency": 2, "duration_s": 1.5})
        streamed = loadtest(spec, url, tmp_path, name="streamed")["steps"][0]
        whole = loadtest({**spec, "stream": False}, url, tmp_path, name="whole")["steps"][0]
    assert streamed["output_tokens_mean"] == whole["output_tokens_mean"] == 17
    # 17 tokens in chunks of 4: the first chunk (4 tokens) at 100 + 30 ms, the rest 40 ms apart,
    # so 10 ms a token between chunks, and TPOT (the time after the first chunk over 16 tokens)
    # 130 / 16 ms: the first chunk's extra tokens come for free, as with any chunked stream.
    assert 125 <= streamed["ttft_ms"]["p50"] <= 180
    assert 9.0 <= streamed["itl_ms"]["p50"] <= 14 and 7.5 <= streamed["tpot_ms"]["p50"] <= 11
    assert streamed["failures"] == whole["failures"] == 0
    # Not streamed: the first token is seen with the whole answer, 100 + 16 * 10 ms.
    assert 255 <= whole["ttft_ms"]["p50"] <= 330 and whole["tpot_ms"]["p50"] is None


def test_a_concurrency_sweep_finds_the_knee_where_the_server_saturates(tmp_path):
    # Two slots, 100 ms + 15 x 20 ms a request: 5 requests/s at most, reached at concurrency 2
    # At concurrency 2 a slot idles for each round trip between one request and the sender's
    # next, which a loaded machine stretches to tens of ms, and concurrency 4 wins that back:
    # a gain threshold of 30 % tells that from the doubling of 1 to 2.
    fake = FakeOpenAI(ttft_s=0.1, itl_s=0.02, slots=2)
    spec = workload(tenants=[{"name": "a", "api_key": "k"}], output_tokens=16, slo={},
                    mode={"kind": "sweep", "concurrencies": [1, 2, 4, 8], "duration_s": 3.0, "min_gain": 0.3})
    with serve(fake) as url:
        result = loadtest(spec, url, tmp_path)
    steps = result["steps"]
    assert len(steps) == 3, "the sweep goes one step past the knee and stops"
    assert result["knee"] == 2 and steps[1]["concurrency"] == 2 and steps[1]["step"] == 2  # counted from 1
    assert result["knee_reason"] == "throughput stopped rising at step 3"
    assert steps[1]["requests_per_s"] == pytest.approx(5, rel=0.15)
    # One at a time: 2.5 a second at most; a loaded host's round trips only take from it.
    assert 2.5 * 0.6 <= steps[0]["requests_per_s"] <= 2.5 * 1.1
    # Past the knee the extra requests only wait for a slot.
    assert steps[2]["ttft_ms"]["p50"] > steps[1]["ttft_ms"]["p50"] + 200


def test_a_rate_sweep_stops_where_the_slo_breaks(tmp_path):
    # Capacity 10 requests/s; at 16/s the queue grows for the whole step and TTFT with it.
    fake = FakeOpenAI(ttft_s=0.05, itl_s=0.01, slots=2)
    spec = workload(tenants=[{"name": "a", "api_key": "k"}], output_tokens=16,
                    slo={"ttft_p95_ms": 400, "tpot_p95_ms": 50},
                    mode={"kind": "sweep", "rates": [2, 4, 16, 32], "duration_s": 3.0})
    with serve(fake) as url:
        result = loadtest(spec, url, tmp_path)
    steps = result["steps"]
    assert [s["rate"] for s in steps] == [2.0, 4.0, 16.0]
    assert [s["meets_slo"] for s in steps] == [True, True, False]
    assert result["knee"] == 2 and result["knee_reason"] == "slo broken at step 3"
    assert steps[2]["ttft_ms"]["p95"] > 400
    assert steps[2]["goodput_requests_per_s"] < steps[2]["requests_per_s"]


def test_against_the_platform_a_tenant_over_its_rate_is_rejected_by_reason(platform):
    """The platform's own error bodies (429 with `error.code`), its multi-token chunks and
    usage, read by the same tool: one tenant allowed one request a minute."""
    _, open_key = platform.tenant()
    _, limited_key = platform.tenant(requests_per_minute=1)
    spec = workload(model=MODEL_ALIAS, output_tokens=8, slo={"ttft_p95_ms": 30_000},
                    tenants=[{"name": "open", "api_key": open_key, "share": 1},
                             {"name": "limited", "api_key": limited_key, "share": 1}],
                    mode={"kind": "rate", "rate": 4, "duration_s": 3})
    [s] = run(parse(spec), platform.base_url, show_progress=False, timeout_s=60)["steps"]
    platform.check()
    opened, limited = s["per_tenant"]["open"], s["per_tenant"]["limited"]
    assert limited["requests"] >= 2 and opened["requests"] >= 2
    assert limited["served"] == 1 and limited["rejections"] == {"rate": limited["requests"] - 1}
    assert s["rejections"] == limited["rejections"] and s["failures"] == 0
    assert opened["served"] == opened["requests"] and opened["output_tokens_mean"] == 8
    assert 0 < opened["ttft_ms"]["p50"] < opened["e2e_ms"]["p50"]
    assert opened["revisions"] == {platform.model_revision: opened["served"]}  # what ran them, from the stream


SHIPPED_WORKLOAD = Path(__file__).resolve().parents[1] / "perf" / "loadtest_workload.yaml"


def test_a_20_s_sweep_makes_its_own_tenants_on_the_platform_and_the_plan_reads_it(platforms, tmp_path):
    """The README's short run: the shipped workload with no keys set, the admin token only,
    four steps of 5 s; then again, reusing the tenants with fresh keys."""
    platform = platforms("embedded")
    token = f"admin-{uuid.uuid4().hex}"
    prefix = f"lt{uuid.uuid4().hex[:6]}-"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOADTEST_KEY_")}
    env["LEDGERLM_BOOTSTRAP_TOKEN"] = token
    out = tmp_path / "out"

    def loadtest_cli(url: str, *options: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "api.cli", "loadtest", str(SHIPPED_WORKLOAD), "--target", url,
                               "--model", MODEL_ALIAS, "--tenant-prefix", prefix, "--out", str(out), "--no-progress",
                               *options], env=env, capture_output=True, text=True, timeout=240)

    with platform.api_replica(bootstrap_token=token) as url:
        started = time.monotonic()
        done = loadtest_cli(url, "--steps", "4", "--duration", "5", "--name", "short")
        took = time.monotonic() - started
        again = loadtest_cli(url, "--steps", "1", "--duration", "1", "--name", "again")
    platform.check()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 steps of 5 s each (2, 4, 8, 16 requests/s)" in done.stdout
    assert f"tenants {prefix}interactive (made), {prefix}background (made), each with a fresh key" in done.stdout
    assert took < 90, f"the short run took {took:.0f} s"
    result = json.loads((out / "short.json").read_text())
    steps = result["steps"]
    assert 1 <= len(steps) <= 4 and [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    first = steps[0]
    assert first["failures"] == 0 and first["rejections"] == {}, first  # the made keys were good
    assert {"interactive", "background"} <= set(first["per_tenant"])
    assert all(t["served"] > 0 for t in first["per_tenant"].values())
    # Made once: the second run reuses both tenants, with keys of their own that work.
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{prefix}interactive (reused), {prefix}background (reused)" in again.stdout
    assert json.loads((out / "again.json").read_text())["steps"][0]["failures"] == 0

    plan = subprocess.run([sys.executable, "-m", "api.cli", "capacity", "plan", "--peak-rps", "10",
                           "--output-tokens", "32", "--from-loadtest", str(out / "short.json"), "--json"],
                          capture_output=True, text=True, timeout=120)
    met = [s for s in steps if s["meets_slo"] and s["goodput_output_tokens_per_s"] > 0]
    if not met:
        assert plan.returncode == 2 and "no step of the load test met its SLO" in plan.stderr
        return
    best = max(met, key=lambda s: s["goodput_output_tokens_per_s"])
    never_saturated = best is steps[-1] and result["knee_reason"] == "sweep ended"
    if never_saturated:
        assert plan.returncode == 2 and "did not reach saturation" in plan.stderr, plan.stderr
    else:
        assert plan.returncode == 0, plan.stderr
        assert json.loads(plan.stdout)["per_replica_source"]["step"] == best["step"]
