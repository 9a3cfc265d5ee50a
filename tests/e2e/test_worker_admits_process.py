"""`serve worker --admit` as deployed: the API and one worker process that also runs
admission (no admission process at all). A request is admitted, taken in the same commit,
streamed and settled; it never reaches a work topic. On the embedded log the worker's
engine is a stand-in of known speed (`tests.slow_engine`); on Kafka it is real vLLM, and
the worker and the API run off the CPUs vLLM bound its compute threads to, with the engine
pinned to those CPUs (`LEDGERLM_ENGINE_PINNED`)."""
from __future__ import annotations

import json
import os

import httpx
import psutil

from models import topics
from models.settings import format_cpu_list
from tests.e2e.test_streaming import request_events, sse_frames
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until
from tests.perf.deployed import deployed
from workers.vllm_engine import bound_cpus


# The worker's engine when it is not what a test is about: one token every 10 ms, no model.
STAND_IN = {"LEDGERLM_ENGINE_FACTORY": "tests.slow_engine:SlowEngine.from_settings", "LEDGERLM_CPUS": "all",
            "LEDGERLM_TEST_TOKEN_PAUSE_S": "0.01"}


def assert_placed_off_the_engine(printed: str | None, engine_printed: str | None) -> None:
    """vLLM bound its compute threads to some of the host's CPUs; the worker's threads and the
    API's run on the others, which the worker printed when ready. Pinned, every thread of
    the engine's processes runs on its compute CPUs, which the worker printed too."""
    allowed = os.sched_getaffinity(0)
    assert len(allowed) >= 2, f"placement needs two CPUs or more; this host gives {sorted(allowed)}"
    mine = psutil.Process().children(recursive=True)
    # The deployed worker's engine, not the test session's own (also a child of this process).
    [worker] = [p for p in mine if "serve worker" in " ".join(p.cmdline())]
    engine = [p for p in worker.children(recursive=True) if "VLLM" in p.name()]
    assert engine, "the worker's engine processes are not there"
    compute = bound_cpus(engine, allowed)
    assert compute and compute < allowed, f"vLLM bound its compute threads to {sorted(compute)} of {sorted(allowed)}"
    assert printed == format_cpu_list(allowed - compute)
    for role in ("serve worker", "serve api"):
        [process] = [p for p in mine if role in " ".join(p.cmdline())]
        where = {frozenset(os.sched_getaffinity(t.id)) for t in process.threads()}
        assert where == {frozenset(allowed - compute)}, f"{role} threads run on {where}"
    engine_where = {frozenset(os.sched_getaffinity(t.id)) for p in engine for t in p.threads()}
    assert engine_printed == format_cpu_list(compute)
    assert all(cpus <= compute for cpus in engine_where), f"engine threads run on {engine_where}"


def worker_ready(home) -> dict:
    """What the worker printed when ready; it admits, and no admission process was started."""
    ready = [json.loads(line) for line in (home / "worker.log").read_text().splitlines()
             if line.startswith("{") and '"ready"' in line]
    assert ready and ready[0]["admits"] is True
    assert not (home / "admission.log").exists(), "no admission process was started"
    return ready[0]


def test_a_worker_that_admits_serves_without_an_admission_process(tiny_model_dir, tmp_path):
    home = tmp_path / "deployed"
    with deployed("embedded", tiny_model_dir, home, max_seqs=4, take_ahead=4, stream_linger_ms=0, worker_admits=True,
                  environment=STAND_IN) as platform:
        admitted_and_taken_at_once(platform, worker_ready(home)["revision"])


def test_a_worker_that_admits_on_vllm_runs_off_its_engines_cpus_with_the_engine_pinned(tiny_model_dir, tmp_path,
                                                                                     kafka_url, own_vllm):
    home = tmp_path / "deployed"
    with deployed("kafka", tiny_model_dir, home, max_seqs=4, take_ahead=4, stream_linger_ms=0, worker_admits=True,
                  environment={"LEDGERLM_ENGINE_PINNED": "1"}) as platform:
        ready = worker_ready(home)
        assert_placed_off_the_engine(ready["cpus"], ready["engine_cpus"])
        admitted_and_taken_at_once(platform, ready["revision"])


def admitted_and_taken_at_once(platform, revision: str) -> None:
    """A request, streamed and settled, was taken at admission: it never reached a work topic."""
    tenant_id, secret = platform.tenant()
    body = {"model_alias": MODEL_ALIAS, "input": "one commit", "max_output_tokens": 8, "ignore_eos": True}
    with httpx.Client(base_url=platform.base_url, timeout=120,
                      headers={"Authorization": f"Bearer {secret}"}) as client:
        # The API may see the new key a moment after it is issued.
        response = wait_until(lambda: (r := client.post("/v1/generations", json={**body, "stream": False}))
                              .status_code != 401 and r, 30, what="the API to know the key")
        assert response.status_code == 200, response.text
        with client.stream("POST", "/v1/generations", json=body) as streamed:
            assert streamed.status_code == 200
            frames = [data for _, data in sse_frames(streamed)]
    final = frames[-2]
    assert frames[-1] == "[DONE]" and final["type"] == "completed"
    assert final["usage"]["output_tokens"] == 8
    request_id = final["request_id"]

    def settled():
        return [env for _, env in request_events(platform.log, request_id, topics.LEDGER)
                if env.event_type == "UsageSettled"]
    [settlement] = wait_until(settled, 60, what="the settlement")
    assert settlement.payload.output_tokens == 8 and settlement.payload.terminal_status == "completed"
    assert [env.event_type for _, env in request_events(platform.log, request_id, topics.OUTCOMES)] == [
        "GenerationStarted", "GenerationCompleted"]
    for work in topics.pool_work_topics(None, revision):
        assert request_events(platform.log, request_id, work) == [], "taken at admission, never queued"
