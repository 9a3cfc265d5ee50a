"""The deployed entrypoints serve `/metrics` on `LEDGERLM_METRICS_PORT`: `ledgerlm serve
admission`, `serve projector`, `serve batch-dispatcher`, `serve batch-worker` (whose
Celery child runs the chunks and serves their series) and `python -m workers serve worker`
(on a fake engine), each its own process on the embedded defaults under one home, driven
a little and scraped over HTTP."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from types import SimpleNamespace

import httpx

from models import batch_keys, topics
from models.settings import Settings
from pipelines.bootstrap import Bootstrap
from tests.fake_engine import FakeEngine, queue_work
from tests.harness import free_port, open_isolated_log
from tests.helpers import Launched
from tests.integration.test_process_metrics import labels, request_for

SERVE = [sys.executable, "-m", "api.cli", "serve"]


def environment(home, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LEDGERLM_") or k.startswith("LEDGERLM_TEST_")}  # the embedded defaults
    return {**env, "PYTHONUNBUFFERED": "1", "LEDGERLM_HOME": str(home), **extra}


def scraped(port: int):
    """The samples at the port's `/metrics`, or None while nothing serves there."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    except httpx.TransportError:
        return None
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def test_admission_projector_and_dispatcher_processes_serve_metrics(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    log = open_isolated_log("embedded", home)
    Bootstrap(Settings(home=home)).event_log().close()  # topics made before the processes start
    ports = {role: free_port() for role in ("admission", "projector", "batch-dispatcher")}
    started = [Launched([*SERVE, role], env=environment(home, LEDGERLM_METRICS_PORT=str(port)),
                        ready=None if role == "admission" else '"ready"', ready_s=120)
               for role, port in ports.items()]
    try:
        admission, projector, dispatcher = started
        request_for(log, "t-nobody")  # no such tenant: rejected
        found = admission.wait_until(lambda: (f := scraped(ports["admission"])) and f.get(
            ("ledgerlm_admission_processor_decisions_total", labels(outcome="rejected", reason="tenant_disabled")))
            and f, 120, what="admission to count its rejection")
        assert found[("ledgerlm_open_reservations", labels())] == 0
        def lag():
            return {dict(k[1])["projection"]: v for k, v in (scraped(ports["projector"]) or {}).items()
                    if k[0] == "ledgerlm_projection_lag_records"}
        # It applied what admission wrote (the rejection) and says it is behind by nothing.
        caught_up = projector.wait_until(lambda: (found := lag()) and not any(found.values()) and found, 60,
                                         what="the projector's lag, caught up")
        assert len(caught_up) >= 3, caught_up
        chunks = dispatcher.wait_until(lambda: scraped(ports["batch-dispatcher"]), 60, what="the dispatcher's metrics")
        assert chunks[("ledgerlm_batch_chunks", labels(status="queued"))] == 0
        assert chunks[("ledgerlm_batches_open", labels())] == 0
    finally:
        for process in started:
            process.stop()
        log.close()


def test_batch_worker_child_serves_the_chunks_it_ran(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    queue = f"metrics-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = environment(home, LEDGERLM_METRICS_PORT=str(port), LEDGERLM_BATCH_QUEUE=queue)
    settings = Settings(home=home, batch_queue=queue)
    platform = Bootstrap(settings)
    platform.event_log().close()
    worker = Launched([*SERVE, "batch-worker"], env=env, ready="ready.", ready_s=120)
    try:
        found = worker.wait_until(lambda: scraped(port), 60, what="the batch worker's child to serve")
        assert found[("ledgerlm_batch_worker_chunks_running", labels())] == 0
        # A chunk of a stopped batch: the worker reports it skipped without an engine.
        tenant_id, batch_id = "t-metrics", "batch_" + uuid.uuid4().hex[:8]
        platform.object_store().put_bytes(batch_keys.stop_marker_key(tenant_id, batch_id), b"batch_cancelled")
        chunk_queue = platform.chunk_queue()
        chunk_queue.enqueue({"tenant_id": tenant_id, "batch_id": batch_id, "chunk_index": 0, "reservation_id": "res",
                             "endpoint": "/v1/completions", "model_alias": None, "model_revision": "fake@1",
                             "model_path": "/nowhere", "engine_config_hash": "fake", "max_model_len": 512,
                             "input_key": "nowhere", "part_key": f"{batch_id}/parts/0"})
        chunk_queue.close()
        ended = worker.wait_until(lambda: (f := scraped(port)) and f.get(
            ("ledgerlm_batch_worker_chunks_total", labels(outcome="skipped"))) and f, 90, what="the chunk counted")
        assert ended[("ledgerlm_batch_worker_chunks_running", labels())] == 0
        assert ended[("ledgerlm_batch_worker_chunks_total", labels(outcome="failed"))] == 0
        with open_isolated_log("embedded", home) as log:
            skipped = [r for r in log.read_topic(topics.BATCHES.name) if b"BatchChunkSkipped" in r.value]
        assert skipped, "the worker reported the chunk"
    finally:
        worker.stop()



class DeployedFakeEngine(FakeEngine):
    """The fake engine as `LEDGERLM_ENGINE_FACTORY` names it for a deployed worker process."""

    config = SimpleNamespace(max_num_seqs=4)

    @classmethod
    def from_settings(cls, settings: Settings) -> "DeployedFakeEngine":
        return cls(hold=False)

    def compute_cpus(self) -> set[int]:
        return set()

    def pin_to_compute_cpus(self) -> set[int]:
        return set()


def test_a_worker_process_that_admits_serves_worker_and_admission_metrics(tmp_path):
    home = tmp_path / "home"
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"a fake engine reads nothing here")  # approval digests the files
    port = free_port()
    env = environment(home, LEDGERLM_METRICS_PORT=str(port), LEDGERLM_MODEL=str(model), LEDGERLM_WORKER_ADMITS="1",
                      LEDGERLM_ENGINE_FACTORY=f"{__name__}:DeployedFakeEngine.from_settings")
    approved = subprocess.run([sys.executable, "-m", "workers", "model", "approve"], env=env, capture_output=True,
                              text=True, timeout=120)
    assert approved.returncode == 0, approved.stderr
    revision = json.loads(approved.stdout)["model_revision"]
    worker = Launched([sys.executable, "-m", "workers", "serve", "worker"], env=env, ready='"ready": true',
                      ready_s=120)
    log = open_isolated_log("embedded", home)
    try:
        assert json.loads(worker.ready_line)["metrics_port"] == port
        for _ in range(2):
            queue_work(log, "t-metrics", "req_" + uuid.uuid4().hex[:12], topic=topics.work_topic(None, "normal",
                                                                                                 revision))
        request_for(log, "t-nobody")  # its admission rejects it: no such tenant
        mine = {"pool": "interactive", "revision": revision}
        found = worker.wait_until(lambda: (f := scraped(port)) and f.get(
            ("ledgerlm_worker_output_tokens_total", labels(**mine))) == 2 and f.get(
            ("ledgerlm_admission_processor_decisions_total", labels(outcome="rejected", reason="tenant_disabled")))
            and f, 60, what="both generations' tokens and the rejection counted")
        assert found[("ledgerlm_worker_queued", labels(**mine, priority="normal"))] == 0
        assert found[("ledgerlm_worker_free_slots", labels(**mine))] >= 4
        assert not any(name.startswith("ledgerlm_engine_") for name, _ in found), "a fake engine keeps no stats"
    finally:
        worker.stop()
        log.close()
