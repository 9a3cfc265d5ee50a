"""Each long-running process serves its Prometheus series over HTTP: admission counts its
decisions and settlements, the pool worker its queue, slots and tokens (and its engine's
own stats), the projector its lag, the batch dispatcher its chunks, the API the fleet.
Components run in this process on fake engines; each serves `/metrics` on a port of its
own, scraped as Prometheus would."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from models import topics
from models.events import new_event
from models.events_generation import GenerationCompleted, GenerationRequested, Position, PromptSubmitted, Timings
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.admin.commands import RegistryView
from pipelines.admission.processor import AdmissionProcessor
from pipelines.admission.metrics import AdmissionMetrics
from pipelines.metrics import MetricsServer, dispatcher_metrics, projector_metrics
from pipelines.publish import publish
from tests.fake_engine import FakeEngine, queue_work, run_until
from tests.harness import api_services, isolated_log_opener, serve_api
from tests.helpers import wait_until
from workers.engine_runner import EngineRunner
from workers.engine_stats import EngineStats
from workers.interactive import InteractiveWorker
from workers.metrics import worker_metrics

REVISION = "fake@1"


def scrape(server: MetricsServer | str) -> dict[tuple[str, frozenset], float]:
    url = server if isinstance(server, str) else f"http://127.0.0.1:{server.port}/metrics"
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def labels(**kv) -> frozenset:
    return frozenset(kv.items())


@pytest.fixture
def open_log(request, tmp_path, kafka_url):
    kind = getattr(request, "param", "embedded")
    logs = []

    def opener():
        log = fresh()
        logs.append(log)
        return log
    fresh = isolated_log_opener(kind, tmp_path, kafka_url=kafka_url, prefix="metrics")
    yield opener
    for log in logs:
        log.close()


def request_for(log, tenant_id: str, *, max_output_tokens: int = 4) -> tuple[str, object]:
    request_id = "req_" + uuid.uuid4().hex[:12]
    [prompt] = publish(log, topics.PROMPTS, [new_event(PromptSubmitted(request_id=request_id, prompt="p"),
                                                      tenant_id=tenant_id, correlation_id=request_id)])
    req = GenerationRequested(request_id=request_id, model_alias="fake", model_revision=REVISION, input_tokens=2,
                              input_sha256="0" * 64, max_output_tokens=max_output_tokens,
                              deadline_at=datetime.now(timezone.utc) + timedelta(minutes=5),
                              prompt_ref=Position(topic=prompt.topic, partition=prompt.partition,
                                                  offset=prompt.offset))
    env = new_event(req, tenant_id=tenant_id, correlation_id=request_id)
    publish(log, topics.REQUESTS, [env])
    return request_id, env


@pytest.mark.parametrize("open_log", ["embedded", "kafka"], indirect=True)
def test_admission_counts_decisions_settlements_and_open_reservations(open_log):
    log = open_log()
    view = RegistryView(open_log())
    admin.approve_model(view, alias="fake", model_revision=REVISION, model_path="/nowhere", engine_config_hash="fake",
                        max_model_len=512, actor="tests")
    tenant_id = "t" + uuid.uuid4().hex[:10]
    admin.create_tenant(view, tenant_id=tenant_id, name=tenant_id, actor="tests")
    metrics = AdmissionMetrics()
    processor = AdmissionProcessor(open_log(), RegistryView(open_log()), grace=timedelta(seconds=30),
                                   on_written=metrics.written)
    server = MetricsServer(metrics.follow(processor).registry, port=0)
    try:
        admitted_id, admitted = request_for(log, tenant_id)
        request_for(log, "t-nobody")  # no such tenant: rejected

        def decided():
            processor.run_once(0.05)
            found = scrape(server)
            return found if found.get(("ledgerlm_admission_processor_decisions_total",
                                       labels(outcome="rejected", reason="tenant_disabled"))) else None
        found = wait_until(decided, 60, what="both decisions counted", every_s=0)
        assert found[("ledgerlm_admission_processor_decisions_total", labels(outcome="admitted", reason=""))] == 1
        assert found[("ledgerlm_open_reservations", labels())] == 1

        completed = GenerationCompleted(request_id=admitted_id, finish_reason="length", input_tokens=2,
                                        output_tokens=4, model_revision=REVISION, output_sha256="0" * 64,
                                        timings=Timings())
        publish(log, topics.OUTCOMES, [new_event(completed, tenant_id=tenant_id, correlation_id=admitted_id)])

        def settled():
            processor.run_once(0.05)
            found = scrape(server)
            return found if found.get(("ledgerlm_settlements_total", labels(status="completed"))) else None
        found = wait_until(settled, 60, what="the settlement counted", every_s=0)
        assert found[("ledgerlm_settlements_total", labels(status="completed"))] == 1
        assert found[("ledgerlm_open_reservations", labels())] == 0
        assert found[("ledgerlm_admission_processor_decisions_total", labels(outcome="admitted", reason=""))] == 1
        assert ("process_cpu_seconds_total", labels()) in found, "the process collectors are served too"
    finally:
        server.close()
        processor.close()


class StatsEngine(FakeEngine):
    """A held fake engine that keeps vLLM-style stats, as `VllmEngine` does."""

    def __init__(self):
        super().__init__(hold=True)
        self.stats = EngineStats()


def test_worker_serves_its_queue_slots_tokens_and_engine_stats(open_log):
    engine = StatsEngine()
    runner = EngineRunner(engine, name="metrics-engine").start()
    log = open_log()
    worker = InteractiveWorker(log, runner, engine, max_in_flight=1, take_ahead=0, worker_id="metrics-worker",
                               cancel_log=open_log())
    server = MetricsServer(worker_metrics(worker), port=0)
    try:
        for _ in range(3):
            queue_work(log, "t-metrics", "req_" + uuid.uuid4().hex[:12])
        run_until(worker, lambda: worker.in_flight == 1 and worker.queued == 2, "one taken, two read ahead")
        # What vLLM hands its stat loggers after a step (its own classes: their fields are read).
        from vllm.v1.metrics.stats import IterationStats, SchedulerIterationDetails, SchedulerStats

        scheduler = SchedulerStats(kv_cache_usage=0.25, num_running_reqs=1, num_waiting_reqs=2,
                                   iteration_details=SchedulerIterationDetails(
                                       iteration_index=0, num_ctx_requests=0, num_ctx_tokens=0,
                                       num_generation_requests=1, num_generation_tokens=1, elapsed_ms=3.0))
        iteration = IterationStats()
        iteration.num_preempted_reqs, iteration.num_generation_tokens = 1, 5
        runner.submit_nowait(_record(engine.stats, scheduler, iteration))
        found = wait_until(lambda: (f := scrape(server)).get(("ledgerlm_engine_step_seconds_count",
                                                               labels(pool="interactive", revision=""))) and f,
                           30, what="the engine's stats recorded")
        mine = {"pool": "interactive", "revision": ""}
        assert found[("ledgerlm_worker_queued", labels(**mine, priority="normal"))] == 2
        assert found[("ledgerlm_worker_queued", labels(**mine, priority="high"))] == 0
        assert found[("ledgerlm_worker_oldest_queued_seconds", labels(**mine, priority="normal"))] > 0
        assert found[("ledgerlm_worker_running", labels(**mine))] == 1
        assert found[("ledgerlm_worker_free_slots", labels(**mine))] == 0
        assert found[("ledgerlm_worker_output_tokens_total", labels(**mine))] == 0
        assert found[("ledgerlm_engine_kv_cache_usage", labels(**mine))] == 0.25
        assert found[("ledgerlm_engine_preemptions_total", labels(**mine))] == 1
        assert found[("ledgerlm_engine_step_seconds_bucket", labels(**mine, le="0.005"))] == 1
        assert found[("ledgerlm_engine_step_seconds_bucket", labels(**mine, le="0.0025"))] == 0
    finally:
        server.close()
        for request_id in list(engine._aborted):  # noqa: SLF001 - let held generations end
            runner.submit(engine.abort(request_id), timeout=10)
        worker.close(drain_timeout_s=10)
        runner.close()


async def _record(stats: EngineStats, scheduler, iteration) -> None:
    stats.record(scheduler, iteration)  # on the engine's loop, as vLLM's output handler calls it


def test_projector_serves_its_lag_per_projection(tmp_path, open_log):
    from api.projector import projection_runner

    settings = Settings(home=tmp_path / "home")
    log = open_log()
    runner, engine = projection_runner(settings, log)
    server = MetricsServer(projector_metrics(runner), port=0)
    try:
        view = RegistryView(open_log())
        for n in range(3):
            admin.create_tenant(view, tenant_id=f"t{n}-{uuid.uuid4().hex[:6]}", name="lag", actor="tests")
        runner.lag()  # looks at the log's ends, as each batch does
        behind = scrape(server)
        projections = {dict(key[1])["projection"]: value for key, value in behind.items()
                       if key[0] == "ledgerlm_projection_lag_records"}
        assert projections and all(value >= 3 for value in projections.values()), projections
        runner.run_until_caught_up()
        caught_up = scrape(server)
        assert {caught_up[("ledgerlm_projection_lag_records", labels(projection=name))] for name in projections} == {0}
    finally:
        server.close()
        engine.dispose()


def test_dispatcher_serves_its_chunks_by_status():
    from models.batch import BatchState, ChunkState

    batch = BatchState(tenant_id="t", batch_id="b", endpoint="/v1/completions", input_key="k", input_file_id="f",
                       completion_window="24h", created_at=datetime.now(timezone.utc),
                       expires_at=datetime.now(timezone.utc) + timedelta(days=1), metadata={}, application_id="default",
                       model_alias=None, summarization=None)
    batch.chunks = [ChunkState(i, 4, 40, 0) for i in range(4)]
    for chunk, status in zip(batch.chunks, ("queued", "running", "completed", "failed")):
        chunk.status = status
    dispatcher = SimpleNamespace(book=SimpleNamespace(batches={("t", "b"): batch}))
    server = MetricsServer(dispatcher_metrics(dispatcher), port=0)
    try:
        found = scrape(server)
    finally:
        server.close()
    for status, count in {"pending": 0, "queued": 1, "running": 1, "completed": 1, "failed": 1}.items():
        assert found[("ledgerlm_batch_chunks", labels(status=status))] == count
    assert found[("ledgerlm_batches_open", labels())] == 1


def test_api_serves_live_workers_and_free_slots_per_pool_and_revision(tmp_path, open_log):
    from api.app import create_app

    engine = FakeEngine(hold=False)
    runner = EngineRunner(engine, name="fleet-engine").start()
    worker = InteractiveWorker(open_log(), runner, engine, max_in_flight=3, take_ahead=0, worker_id="fleet-worker",
                               cancel_log=open_log(), revision=REVISION, engine_config_hash="fake", heartbeat_s=0.2)
    server, thread, port = serve_api(create_app(api_services(Settings(home=tmp_path / "api"), open_log())),
                                     "metrics-api", lifespan="on")
    try:
        worker.join()
        key = labels(pool="interactive", revision=REVISION)
        # Its join says what it serves; its free slots come with its first heartbeat.
        found = wait_until(lambda: (f := scrape(f"http://127.0.0.1:{port}/metrics")).get(
            ("ledgerlm_fleet_serving_workers", key)) and f.get(("ledgerlm_fleet_free_slots", key)) and f, 30,
            what="the API to see the worker and its heartbeat")
        assert found[("ledgerlm_fleet_live_workers", key)] == 1
        assert found[("ledgerlm_fleet_free_slots", key)] == 3
    finally:
        server.should_exit = True
        thread.join(15)
        worker.close(drain_timeout_s=5)
        runner.close()


def test_a_vllm_worker_serves_the_engines_own_stats(engine_runner, open_log):
    """The session's vLLM engine reports its steps to the worker's metrics (stats are on by default)."""
    log = open_log()
    worker = InteractiveWorker(log, engine_runner, engine_runner.engine, max_in_flight=2, take_ahead=0,
                               worker_id="vllm-metrics-worker", cancel_log=open_log())
    server = MetricsServer(worker_metrics(worker), port=0)
    mine = labels(pool="interactive", revision="")
    try:
        steps_before = scrape(server)[("ledgerlm_engine_step_seconds_count", mine)]
        queue_work(log, "t-metrics", "req_" + uuid.uuid4().hex[:12])
        run_until(worker, lambda: worker.output_tokens >= 1 and not worker.in_flight, "the generation to end")
        found = wait_until(lambda: (f := scrape(server))[("ledgerlm_engine_step_seconds_count", mine)] > steps_before
                           and f, 30, what="the engine's steps counted")
        assert found[("ledgerlm_engine_step_seconds_sum", mine)] > 0
        assert 0 <= found[("ledgerlm_engine_kv_cache_usage", mine)] <= 1
        assert ("ledgerlm_engine_preemptions_total", mine) in found
        assert any(name == "vllm:kv_cache_usage_perc" for name, _ in found), "vLLM's own series are served too"
    finally:
        server.close()
        worker.close(drain_timeout_s=30)
