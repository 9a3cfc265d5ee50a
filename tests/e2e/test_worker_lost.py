"""A worker that goes silent without leaving (what SIGKILL leaves behind) is lost within
seconds: each generation it ran fails as `worker_lost` on the outcomes and stream topics
and settles exactly once, its tenant's concurrency slot is free again, and its late
outputs, should it come back, settle nothing. With admission beside the workers (`serve
worker --admit`) too, where the admission that dies with the worker hands its tenants to
another, which finds what the lost worker ran on the outcomes topic. Workers on a holding
fake engine; both logs."""
from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from models import topics
from models.events import new_event
from models.events_generation import (
    GenerationCompleted, GenerationRequested, Position, PromptSubmitted, Timings,
)
from pipelines.admin import commands as admin
from pipelines.admin.commands import RegistryView
from pipelines.admission.processor import AdmissionProcessor
from pipelines.publish import publish
from tests.conftest import make_log_opener
from tests.e2e.test_streaming import request_events
from tests.fake_engine import FakeEngine
from tests.harness import Loop
from tests.helpers import wait_until
from workers.engine_runner import EngineRunner
from workers.interactive import InteractiveWorker

REVISION = "fake@lost"
LOST_AFTER_S = 3.0
# What the lost bound allows on top of `LOST_AFTER_S`: the fleet read (0.25 s), the check
# (0.25 s), the settlement's linger (0.25 s) and a loaded machine's slack.
SLACK_S = 4.0


class Node:
    """What one worker process holds: a worker on a holding fake engine and, with `admits`,
    admission beside it (its taker). `crash` stops all of it as SIGKILL would: no leave, no
    flush, the heartbeats stop."""

    def __init__(self, open_log, *, admits: bool):
        self.runner = EngineRunner(FakeEngine(hold=True), name="fake-engine").start()
        self.logs = [open_log() for _ in range(3)]
        self.worker = InteractiveWorker(self.logs[0], self.runner, self.runner.engine, max_in_flight=2, take_ahead=0,
                                        worker_id=f"w-{uuid.uuid4().hex[:6]}", revision=REVISION,
                                        engine_config_hash="fake", cancel_log=self.logs[1])
        self.loops = [Loop(f"{self.worker.worker_id}", lambda: self.worker.run_once(0.02), lambda: None).start()]
        self.admission = admission(self.logs[2], taker=self.worker) if admits else None
        if self.admission is not None:
            self.loops.append(Loop("admission", lambda: self.admission.run_once(0.02), lambda: None).start())
        self.crashed = False

    def crash(self) -> None:
        self.crashed = True
        for loop in self.loops:
            loop.halt(10)
        self.worker.silence()
        self.worker._cancels.stop()  # noqa: SLF001 - no orderly close: the fake engine holds its work
        self.worker._consumer.close()  # noqa: SLF001 - (its group sees it gone at once, not after a timeout)
        if self.admission is not None:
            self.admission.fleet.close()
            self.admission._consumer.close()  # noqa: SLF001 - no flush: what it had not written is lost

    def close(self) -> None:
        if not self.crashed:
            for loop in self.loops:
                loop.halt(10)
            if self.admission is not None:
                self.admission.close()
            self.worker.silence()
            self.worker._cancels.stop()  # noqa: SLF001
            self.worker._consumer.close()  # noqa: SLF001
        self.runner.close()
        for log in self.logs:
            log.close()


def admission(log, taker=None) -> AdmissionProcessor:
    return AdmissionProcessor(log, RegistryView(log), grace=timedelta(seconds=60), taker=taker,
                              member_id=f"a-{uuid.uuid4().hex[:6]}", lost_after_s=LOST_AFTER_S)


class Fleet:
    def __init__(self, open_log):
        self.open_log = open_log
        self.log = open_log()
        self.view = RegistryView(self.log)
        admin.approve_model(self.view, alias="fake-lost", model_revision=REVISION, model_path="/nowhere",
                            engine_config_hash="fake", max_model_len=512, actor="tests")
        self.tenant = "t" + uuid.uuid4().hex[:8]
        admin.create_tenant(self.view, tenant_id=self.tenant, name=self.tenant, actor="tests")
        admin.set_limits(self.view, tenant_id=self.tenant, actor="tests", max_concurrent=1)
        self.nodes: list[Node] = []
        self.closers: list = []

    def node(self, *, admits: bool) -> Node:
        self.nodes.append(Node(self.open_log, admits=admits))
        return self.nodes[-1]

    def admission(self) -> AdmissionProcessor:
        """Admission as a process of its own."""
        log = self.open_log()
        processor = admission(log)
        loop = Loop("admission", lambda: processor.run_once(0.02), processor.close).start()
        self.closers.append(lambda: (loop.halt(10), log.close()))
        return processor

    def request(self, request_id: str, tenant: str | None = None) -> str:
        tenant = tenant or self.tenant
        [prompt] = publish(self.log, topics.PROMPTS, [new_event(PromptSubmitted(request_id=request_id, prompt="p"),
                                                                tenant_id=tenant, correlation_id=request_id)])
        req = GenerationRequested(
            request_id=request_id, model_alias="fake-lost", model_revision=REVISION, input_tokens=1,
            input_sha256="0" * 64, max_output_tokens=4, deadline_at=datetime.now(timezone.utc) + timedelta(seconds=300),
            prompt_ref=Position(topic=prompt.topic, partition=prompt.partition, offset=prompt.offset))
        publish(self.log, topics.REQUESTS, [new_event(req, tenant_id=tenant, correlation_id=request_id)])
        return request_id

    def events(self, topic, request_id: str) -> list:
        return [env for _, env in request_events(self.log, request_id, topic)]

    def types(self, topic, request_id: str) -> list[str]:
        return [env.event_type for env in self.events(topic, request_id)]

    def decided(self, request_id: str) -> str:
        """The ledger's first word on a request, once there is one."""
        return wait_until(lambda: (t := self.types(topics.LEDGER, request_id)) and t[0], 30,
                          what=f"admission to decide {request_id}")

    def started_on(self, request_id: str) -> str:
        [started] = wait_until(lambda: [e for e in self.events(topics.OUTCOMES, request_id)
                                        if e.event_type == "GenerationStarted"], 30, what=f"{request_id} to start")
        return started.payload.worker_id

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        for close in self.closers:
            close()
        self.log.close()


@pytest.fixture(params=["embedded", "kafka"])
def fleet(request, tmp_path):
    made = Fleet(make_log_opener(request.param, tmp_path))
    yield made
    made.close()


def lost_and_settled_once(fleet: Fleet, request_id: str, crashed_at: float) -> float:
    """Waits for the request's `worker_lost` end and settlement; checks both; returns the
    seconds it took from the crash."""
    wait_until(lambda: "UsageSettled" in fleet.types(topics.LEDGER, request_id), LOST_AFTER_S + 30,
               what=f"{request_id} to settle")
    took_s = time.monotonic() - crashed_at
    assert fleet.types(topics.LEDGER, request_id) == ["BudgetReserved", "GenerationAdmitted", "UsageSettled",
                                                      "ReservationReleased"]
    ledger = fleet.events(topics.LEDGER, request_id)
    settled, released = ledger[2].payload, ledger[3].payload
    assert (settled.terminal_status, settled.output_tokens, settled.cost_micros) == ("failed", 0, 0)
    assert released.released_tokens == ledger[0].payload.tokens
    ends = [e for e in fleet.events(topics.OUTCOMES, request_id) if e.event_type == "GenerationFailed"]
    assert [e.payload.error_code for e in ends] == ["worker_lost"]
    stream = fleet.events(topics.STREAM, request_id)
    assert stream[-1].event_type == "GenerationFailed" and stream[-1].payload.error_code == "worker_lost", \
        "a client streaming it reads its end"
    return took_s


def comes_back_and_reports(fleet: Fleet, request_id: str, then_request_id: str) -> None:
    """The lost worker's late end of the request, written after all, settles nothing. The end
    of `then_request_id` (open, of the same tenant: one outcomes partition, read in order),
    written after it, shows when admission has read past it."""
    def completed(rid: str):
        return new_event(GenerationCompleted(request_id=rid, finish_reason="length", input_tokens=1, output_tokens=4,
                                             model_revision=REVISION, output_sha256="0" * 64, timings=Timings()),
                         tenant_id=fleet.tenant, correlation_id=rid)
    late = completed(request_id)
    publish(fleet.log, topics.OUTCOMES, [late])
    publish(fleet.log, topics.STREAM, [late])
    publish(fleet.log, topics.OUTCOMES, [completed(then_request_id)])
    wait_until(lambda: "UsageSettled" in fleet.types(topics.LEDGER, then_request_id), 30,
               what=f"{then_request_id} to settle")
    assert fleet.types(topics.LEDGER, request_id).count("UsageSettled") == 1


@pytest.mark.timing
def test_a_silent_workers_generation_ends_as_worker_lost_in_seconds_and_frees_the_slot(fleet):
    fleet.admission()
    doomed = fleet.node(admits=False)
    first = fleet.request("first")
    assert fleet.started_on(first) == doomed.worker.worker_id
    # Its one slot is held: the tenant's next request is refused while the first runs.
    assert fleet.decided(fleet.request("refused")) == "GenerationRejected"

    doomed.crash()
    crashed_at = time.monotonic()
    took_s = lost_and_settled_once(fleet, first, crashed_at)
    assert took_s <= LOST_AFTER_S + SLACK_S, f"lost after {took_s:.1f} s"

    # The slot is free again: the tenant's next request is admitted and a survivor runs it.
    survivor = fleet.node(admits=False)
    second = fleet.request("second")
    assert fleet.decided(second) == "BudgetReserved"
    assert fleet.started_on(second) == survivor.worker.worker_id
    assert fleet.types(topics.OUTCOMES, first).count("GenerationStarted") == 1, "nothing is served twice"
    comes_back_and_reports(fleet, first, second)


@pytest.mark.timing
def test_with_admission_in_the_workers_the_survivor_ends_what_the_lost_one_admitted_and_ran(fleet):
    doomed = fleet.node(admits=True)
    # Alone, its admission owns every tenant: the request is admitted and taken there.
    first = fleet.request("first")
    assert fleet.started_on(first) == doomed.worker.worker_id
    survivor = fleet.node(admits=True)
    wait_until(lambda: survivor.admission.owned, 30, what="the second admission to own partitions")

    doomed.crash()
    crashed_at = time.monotonic()
    # Whichever admission owned the tenant, the survivor's does now, and learns from the
    # outcomes topic that the lost worker ran the request.
    took_s = lost_and_settled_once(fleet, first, crashed_at)
    assert took_s <= LOST_AFTER_S + SLACK_S, f"lost after {took_s:.1f} s"
    second = fleet.request("second")
    assert fleet.decided(second) == "BudgetReserved", "the tenant's one slot is free again"
    assert fleet.started_on(second) == survivor.worker.worker_id
    comes_back_and_reports(fleet, first, second)
