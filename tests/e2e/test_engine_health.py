"""A worker whose engine dies, beside a healthy worker of the same revision: it takes
nothing more, each of its running generations ends failed (`engine_dead`) and settles
within seconds, it says on the fleet topic that it left, its run ends with a non-zero exit
code, and the work it had read ahead but not taken is served by the other worker. A
worker whose engine is dead from the start takes nothing. `serve worker`, in a process
of its own, exits non-zero when its engine dies. Fake engines that die as vLLM's
does (`tests.dying_engine`); admission settles; both logs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from models import topics
from models.events import decode, new_event
from models.events_generation import GenerationRequested, Position, PromptSubmitted, Sampling
from pipelines.admin import commands as admin
from pipelines.admin.commands import RegistryView
from pipelines.admission.processor import AdmissionProcessor
from pipelines.eventlog import partition_for
from pipelines.publish import publish
from tests.conftest import make_log_opener
from tests.dying_engine import DyingEngine, wedge
from tests.fake_engine import FakeEngine, queue_work
from tests.harness import Loop
from tests.helpers import ROOT, Launched, wait_until
from workers.engine_runner import EngineRunner
from workers.engine_watch import EXIT_ENGINE_DEAD
from workers.interactive import InteractiveWorker

REVISION = "fake@health"
NORMAL = topics.work_topic(None, "normal", REVISION)
SETTLED_WITHIN_S = 10.0  # the watch looks every 0.2 s; the rest is room for a loaded machine


class Fleet:
    """Admission and workers of one revision, each on log handles of its own."""

    def __init__(self, open_log):
        self.open_log = open_log
        self.logs, self.runners, self.loops, self.threads = [], [], [], []
        self.log = self._log()
        self.view = RegistryView(self.log)
        admin.approve_model(self.view, alias="fake", model_revision=REVISION, model_path="/nowhere",
                            engine_config_hash="fake", max_model_len=512, actor="tests")
        admission_log = self._log()
        # No fleet view: each request waits on its key's partition. With one, admission
        # places work where a worker has a slot free, and the tests here need a full worker
        # to hold work read ahead (placement has tests of its own).
        admission = AdmissionProcessor(admission_log, RegistryView(admission_log), grace=timedelta(seconds=5),
                                       member_id=f"a-{uuid.uuid4().hex[:6]}", lost_after_s=None)
        self.loops.append(Loop("admission", lambda: admission.run_once(0.05), admission.close).start())

    def _log(self):
        log = self.open_log()
        self.logs.append(log)
        return log

    def worker(self, engine, name: str, *, serving=None) -> InteractiveWorker:
        """A worker on `engine` (started on a runner of its own), or on `serving`, a wrapper
        of it that runs on the same loop."""
        runner = EngineRunner(engine, name=f"{name}-engine").start(timeout=600)
        self.runners.append(runner)
        return InteractiveWorker(self._log(), runner, serving or engine, max_in_flight=2, take_ahead=0,
                                 worker_id=f"{name}-{uuid.uuid4().hex[:6]}", revision=REVISION,
                                 engine_config_hash="fake", cancel_log=self._log(), heartbeat_s=0.5,
                                 health_interval_s=0.2)

    def loop(self, worker: InteractiveWorker) -> Loop:
        loop = Loop(worker.worker_id, lambda: worker.run_once(0.05), worker.close).start()
        self.loops.append(loop)
        return loop

    def serve(self, worker: InteractiveWorker) -> dict:
        """Runs `worker` as `serve worker` does: until stopped or its engine dies, then
        closes it; the returned dict gets its `exit_code`."""
        ended: dict = {}
        stop = threading.Event()

        def run():
            try:
                worker.run(stop)
            finally:
                worker.close(drain_timeout_s=5)
                ended["exit_code"] = worker.exit_code

        thread = threading.Thread(target=run, name=worker.worker_id, daemon=True)
        thread.start()
        self.threads.append((stop, thread))
        ended["thread"] = thread
        return ended

    def tenant(self) -> str:
        tenant = "t" + uuid.uuid4().hex[:10]
        admin.create_tenant(self.view, tenant_id=tenant, name=tenant, actor="tests")
        return tenant

    @staticmethod
    def request_ids(on: set, count: int) -> list[str]:
        """New request ids whose work lands on a partition of the assignment `on` (a
        revision's work is keyed by request)."""
        found: list[str] = []
        while len(found) < count:
            request_id = f"r{len(found)}-{uuid.uuid4().hex[:6]}"
            if (NORMAL.name, partition_for(request_id, NORMAL.partitions)) in on:
                found.append(request_id)
        return found

    def request(self, tenant: str, request_id: str, *, max_output_tokens: int = 1) -> None:
        [prompt] = publish(self.log, topics.PROMPTS, [new_event(PromptSubmitted(request_id=request_id, prompt="p"),
                                                                tenant_id=tenant, correlation_id=request_id)])
        req = GenerationRequested(
            request_id=request_id, model_alias="fake", model_revision=REVISION, input_tokens=1,
            input_sha256="0" * 64, max_output_tokens=max_output_tokens, sampling=Sampling(ignore_eos=True),
            deadline_at=datetime.now(timezone.utc) + timedelta(seconds=300),
            prompt_ref=Position(topic=prompt.topic, partition=prompt.partition, offset=prompt.offset))
        publish(self.log, topics.REQUESTS, [new_event(req, tenant_id=tenant, correlation_id=request_id)])

    def events(self, topic, request_id: str | None = None) -> list:
        found = [decode(r.value) for r in self.log.read_topic(topic.name)]
        return [env for env in found if request_id is None or env.correlation_id == request_id]

    def close(self) -> None:
        for stop, thread in self.threads:
            stop.set()
            thread.join(30)
        for loop in self.loops:
            loop.halt()
        for runner in self.runners:
            runner.close()
        for log in self.logs:
            log.close()


@pytest.fixture(params=["embedded", "kafka"])
def fleet(request, tmp_path):
    made = Fleet(make_log_opener(request.param, tmp_path))
    yield made
    made.close()


def terminal_of(fleet: Fleet, request_id: str):
    ends = [env for env in fleet.events(topics.OUTCOMES, request_id) if env.event_type != "GenerationStarted"]
    return ends[0] if ends else None


def settled(fleet: Fleet, request_id: str) -> list:
    return [env for env in fleet.events(topics.LEDGER, request_id) if env.event_type == "UsageSettled"]


def starts_by(fleet: Fleet, worker_id: str) -> set[str]:
    return {env.payload.request_id for env in fleet.events(topics.OUTCOMES)
            if env.event_type == "GenerationStarted" and env.payload.worker_id == worker_id}


def one_assignment_each(*workers: InteractiveWorker) -> bool:
    """Whether the workers split the normal work topic's partitions between them."""
    mine = [{p for t, p in (w._assigned or set()) if t == NORMAL.name} for w in workers]  # noqa: SLF001
    return all(mine) and sum(len(m) for m in mine) == NORMAL.partitions and set().union(*mine) == set(
        range(NORMAL.partitions))


@pytest.mark.parametrize("death", ["unhealthy", "core-died"])
def test_a_worker_whose_engine_dies_stops_fails_its_running_work_leaves_and_its_queue_moves(fleet, death):
    dying_engine = DyingEngine(hold=True)
    dying = fleet.worker(dying_engine, "dying")
    healthy = fleet.worker(FakeEngine(hold=False), "healthy")
    served = fleet.serve(dying)
    fleet.loop(healthy)
    wait_until(lambda: one_assignment_each(dying, healthy), 60, what="the two workers to split the work topic")

    # Four requests of a tenant whose work the dying worker owns: two run (held by its
    # engine), two wait in what it read ahead.
    tenant = fleet.tenant()
    request_ids = fleet.request_ids(dying._assigned, 4)  # noqa: SLF001
    for request_id in request_ids:
        fleet.request(tenant, request_id)
    wait_until(lambda: len(dying_engine.started) == 2 and dying.queued == 2, 60,
               what="two generations running and two queued on the dying worker")
    running = set(dying_engine.started)
    waiting = set(request_ids) - running

    died_at = time.monotonic()
    if death == "unhealthy":
        dying_engine.healthy = False
    else:  # its EngineCore process died: vLLM says so, and fails every stream itself
        fleet.runners[0].submit(dying_engine.crash(), timeout=5)

    # Each running generation fails and settles within seconds.
    ends = wait_until(lambda: all(terminal_of(fleet, r) and settled(fleet, r) for r in running) and
                      {r: terminal_of(fleet, r) for r in running}, SETTLED_WITHIN_S,
                      what="the running generations to fail and settle")
    settled_after_s = time.monotonic() - died_at
    for request_id, end in ends.items():
        assert end.event_type == "GenerationFailed" and end.payload.error_code == "engine_dead", end
        [settlement] = settled(fleet, request_id)
        assert settlement.payload.terminal_status == "failed"
    assert settled_after_s < SETTLED_WITHIN_S

    # Its run ends with the exit code a supervisor restarts on, and the fleet hears why.
    served["thread"].join(30)
    assert served.get("exit_code") == EXIT_ENGINE_DEAD
    said = [env.payload for env in fleet.events(topics.FLEET) if getattr(env.payload, "worker_id", "") == dying.worker_id]
    said_types = [type(p).__name__ for p in said]
    assert said_types[0] == "WorkerJoined" and said_types[-1] == "WorkerLeft", said_types
    assert "WorkerDraining" in said_types
    assert (said[-1].reason, said[-1].exit_code) == ("engine_dead", EXIT_ENGINE_DEAD)

    # The work it had read ahead is served by the other worker, once each.
    for request_id in waiting:
        end = wait_until(lambda: terminal_of(fleet, request_id), 60, what=f"{request_id} to be served")
        assert end.event_type == "GenerationCompleted", end
    assert starts_by(fleet, healthy.worker_id) == waiting
    assert starts_by(fleet, dying.worker_id) == running, "the dead worker took more work"
    for request_id in request_ids:
        kinds = [env.event_type for env in fleet.events(topics.OUTCOMES, request_id)]
        assert kinds.count("GenerationStarted") == 1 and len(kinds) == 2, kinds
        wait_until(lambda: settled(fleet, request_id), 30, what=f"{request_id} to settle")
        assert len(settled(fleet, request_id)) == 1


def test_a_worker_whose_engine_is_dead_from_the_start_takes_nothing(fleet):
    engine = DyingEngine(hold=False)
    engine.healthy = False
    doomed = fleet.worker(engine, "doomed")
    tenant = fleet.tenant()
    queue_work(fleet.log, tenant, "waiting-1", topic=NORMAL)
    served = fleet.serve(doomed)
    served["thread"].join(30)
    assert not served["thread"].is_alive(), "a worker with a dead engine kept running"
    assert served["exit_code"] == EXIT_ENGINE_DEAD
    assert engine.started == [] and starts_by(fleet, doomed.worker_id) == set()
    assert not [env for env in fleet.events(topics.FLEET) if getattr(env.payload, "worker_id", "") == doomed.worker_id]
    # The work is still there for a worker that can run it.
    live_engine = FakeEngine(hold=False)
    fleet.loop(fleet.worker(live_engine, "live"))
    wait_until(lambda: terminal_of(fleet, "waiting-1"), 60, what="a live worker to serve the waiting work")
    assert live_engine.started == ["waiting-1"]


def test_a_wedged_engine_s_running_work_is_failed_by_the_worker_itself(fleet):
    engine = DyingEngine(hold=True)
    wedged = fleet.worker(engine, "wedged")
    wedged._watch.timeout_s = 0.2  # noqa: SLF001 - three unanswered health calls in a row: dead
    served = fleet.serve(wedged)
    tenant = fleet.tenant()
    fleet.request(tenant, "stuck-1")
    wait_until(lambda: engine.started == ["stuck-1"] and starts_by(fleet, wedged.worker_id), 60,
               what="the generation to run")
    release = threading.Event()
    fleet.runners[-1].submit_nowait(wedge(release))
    try:
        # Nothing runs on the engine's loop now: the worker writes the failure itself.
        served["thread"].join(30)
        assert served.get("exit_code") == EXIT_ENGINE_DEAD
        end = terminal_of(fleet, "stuck-1")
        assert end is not None and end.event_type == "GenerationFailed" and end.payload.error_code == "engine_dead"
        wait_until(lambda: settled(fleet, "stuck-1"), 30, what="the failure to settle")
        assert "unanswered" in wedged.engine_death
    finally:
        release.set()


@pytest.mark.parametrize("kind", ["embedded", "kafka"])
def test_serve_worker_exits_non_zero_when_its_engine_dies_and_says_it_left(kind, tmp_path):
    open_log = make_log_opener(kind, tmp_path)
    settings = open_log.settings
    revision = f"fake@{uuid.uuid4().hex[:8]}"
    with open_log() as log:
        admin.approve_model(RegistryView(log), alias="fake", model_revision=revision, model_path=str(tmp_path),
                            engine_config_hash="fake", max_model_len=512, actor="tests")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "LEDGERLM_HOME": str(tmp_path),
           "LEDGERLM_EVENT_LOG_URL": settings.event_log_url,
           "LEDGERLM_EVENT_LOG_NAMESPACE": settings.event_log_namespace,
           "LEDGERLM_ENGINE_FACTORY": "tests.dying_engine:MarkedEngine.from_settings", "LEDGERLM_CPUS": "all",
           "LEDGERLM_WORKER_ADMITS": "0"}
    with Launched([sys.executable, "-m", "workers", "serve", "worker", "--revision", revision], env=env,
                  ready='"ready": true', ready_s=120) as worker:
        worker_id = json.loads(worker.ready_line)["worker"]
        (tmp_path / "engine-dies").touch()
        try:
            code = worker.proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the worker outlived its engine: {worker.shown()}") from None
        assert code == EXIT_ENGINE_DEAD, worker.shown()
        assert "the engine died" in worker.output()
    with open_log() as log:
        said = [decode(r.value).payload for r in log.read_topic(topics.FLEET.name)]
    said = [p for p in said if getattr(p, "worker_id", "") == worker_id]
    assert type(said[0]).__name__ == "WorkerJoined" and type(said[-1]).__name__ == "WorkerLeft"
    assert (said[-1].reason, said[-1].exit_code) == ("engine_dead", EXIT_ENGINE_DEAD)
