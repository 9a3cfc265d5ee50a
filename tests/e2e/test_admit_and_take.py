"""Admission and a pool worker in one process: work that can start at once is admitted
and taken in one commit and never queued; work that cannot waits on the work topic as
usual; a commit that fails leaves the started generation without a trace. A fake engine
stands in for vLLM; both event logs."""
from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from models import topics
from models.events import new_event
from models.events_generation import CancelRequested, GenerationRequested, Position, PromptSubmitted
from pipelines.admin import commands as admin
from pipelines.admin.commands import RegistryView
from pipelines.admission.processor import AdmissionProcessor
from pipelines.eventlog import EventLogError
from pipelines.publish import publish
from tests.conftest import make_log_opener
from tests.e2e.test_streaming import request_events
from tests.fake_engine import FakeEngine
from tests.helpers import wait_until
from workers.engine_runner import EngineRunner
from workers.interactive import InteractiveWorker

REVISION = "fake@1"


class Fused:
    """An admission processor whose taker is a worker with `slots` engine slots on a holding
    fake engine; two tenants."""

    def __init__(self, open_log, slots: int = 1):
        self.runner = EngineRunner(FakeEngine(hold=True)).start()
        self.engine = self.runner.engine
        self.log, self.admission_log = open_log(), open_log()
        self.worker = InteractiveWorker(self.log, self.runner, self.engine, max_in_flight=slots, take_ahead=0,
                                        worker_id=f"w-{uuid.uuid4().hex[:6]}", revision=REVISION,
                                        engine_config_hash="fake")
        view = RegistryView(self.admission_log)
        admin.approve_model(view, alias="fake", model_revision=REVISION, model_path="/nowhere",
                            engine_config_hash="fake", max_model_len=512, actor="tests")
        self.tenant, self.other = ("t" + uuid.uuid4().hex[:8] for _ in range(2))
        for tenant in (self.tenant, self.other):
            admin.create_tenant(view, tenant_id=tenant, name=tenant, actor="tests")
        self.admission = AdmissionProcessor(self.admission_log, view, grace=timedelta(seconds=5),
                                            taker=self.worker, member_id=f"a-{uuid.uuid4().hex[:6]}")

    def request(self, request_id: str, tenant: str | None = None) -> None:
        tenant = tenant or self.tenant
        [prompt] = publish(self.log, topics.PROMPTS, [new_event(PromptSubmitted(request_id=request_id, prompt="p"),
                                                                tenant_id=tenant, correlation_id=request_id)])
        req = GenerationRequested(
            request_id=request_id, model_alias="fake", model_revision=REVISION, input_tokens=1,
            input_sha256="0" * 64, max_output_tokens=4,
            deadline_at=datetime.now(timezone.utc) + timedelta(seconds=300),
            prompt_ref=Position(topic=prompt.topic, partition=prompt.partition, offset=prompt.offset))
        publish(self.log, topics.REQUESTS, [new_event(req, tenant_id=tenant, correlation_id=request_id)])

    def cancel(self, request_id: str, tenant: str | None = None) -> None:
        publish(self.log, topics.REQUESTS, [new_event(CancelRequested(request_id=request_id, reason="client"),
                                                      tenant_id=tenant or self.tenant, correlation_id=request_id)])

    def run_until(self, condition, what: str, timeout_s: float = 90):
        def step():
            self.admission.run_once(0.02)
            self.worker.run_once(0.02)
            return condition()
        return wait_until(step, timeout_s, every_s=0, what=what)

    def events(self, topic, request_id: str) -> list:
        return [env for _, env in request_events(self.log, request_id, topic)]

    def types(self, topic, request_id: str) -> list[str]:
        return [env.event_type for env in self.events(topic, request_id)]

    def queued_anywhere(self, request_id: str) -> list[str]:
        return [t.name for t in topics.pool_work_topics(None, REVISION) if self.events(t, request_id)]

    def close(self) -> None:
        self.admission.close()
        self.worker.silence()
        self.worker._cancels.stop()  # noqa: SLF001 - no orderly close: the fake engine holds its work
        self.worker._consumer.close()  # noqa: SLF001
        self.runner.close()
        self.log.close()
        self.admission_log.close()


@pytest.fixture(params=["embedded", "kafka"])
def fused_with(request, tmp_path):
    """`fused_with(slots)`: a `Fused` on each log, closed after the test."""
    made: list[Fused] = []

    def make(slots: int) -> Fused:
        made.append(Fused(make_log_opener(request.param, tmp_path), slots=slots))
        return made[-1]
    yield make
    for plat in made:
        plat.close()


@pytest.fixture
def fused(fused_with):
    return fused_with(1)


def test_work_that_can_start_at_once_is_taken_in_the_admissions_commit_and_never_queued(fused):
    fused.request("now-1")
    fused.run_until(lambda: fused.engine.started == ["now-1"], "the generation to start")
    started = fused.run_until(lambda: [e for e in fused.events(topics.OUTCOMES, "now-1")
                                       if e.event_type == "GenerationStarted"], "its start on the log")
    assert [e.payload.worker_id for e in started] == [fused.worker.worker_id]
    assert fused.types(topics.LEDGER, "now-1") == ["BudgetReserved", "GenerationAdmitted"]
    assert fused.queued_anywhere("now-1") == [], "taken work never reaches a work topic"
    assert fused.types(topics.STREAM, "now-1")[:1] == ["GenerationStarted"]

    # It ends and settles as any other generation does.
    fused.cancel("now-1")
    fused.run_until(lambda: "UsageSettled" in fused.types(topics.LEDGER, "now-1"), "the settlement")
    assert fused.types(topics.OUTCOMES, "now-1") == ["GenerationStarted", "GenerationCancelled"]


def test_work_that_cannot_start_at_once_queues_and_is_taken_from_the_work_topic(fused):
    fused.request("first")
    fused.run_until(lambda: fused.engine.started == ["first"], "the first to take the only slot")
    fused.request("second")
    fused.run_until(lambda: fused.queued_anywhere("second"), "the second to queue")
    assert fused.engine.started == ["first"]
    fused.cancel("first")
    fused.run_until(lambda: fused.engine.started == ["first", "second"], "the second to start from the queue")
    for request_id in ("first", "second"):
        assert fused.types(topics.OUTCOMES, request_id).count("GenerationStarted") == 1
    assert fused.queued_anywhere("first") == []
    [queued_on] = [t for t in topics.pool_work_topics(None, REVISION) if fused.events(t, "second")]
    assert [e.event_type for e in fused.events(queued_on, "second")] == ["GenerationQueued", "GenerationStarted"]


def test_a_light_tenant_is_taken_at_once_while_only_a_heavy_tenants_work_waits(fused_with):
    fused4 = fused_with(4)
    heavy, light = fused4.tenant, fused4.other
    fused4.request("light-1", light)
    fused4.run_until(lambda: fused4.engine.started == ["light-1"], "the light tenant's first request to start")
    fused4.cancel("light-1", light)
    fused4.run_until(lambda: "GenerationCancelled" in fused4.types(topics.OUTCOMES, "light-1"), "it to end")
    for n in range(4):
        fused4.request(f"heavy-{n}", heavy)
    # Three start at once; the fourth would take the last slot while the light tenant was
    # active recently and the heavy one is over its share: it waits in the worker's queue.
    fused4.run_until(lambda: fused4.queued_anywhere("heavy-3") and fused4.worker.queued == 1
                     and len(fused4.engine.started) == 4,
                     "three to start and the heavy tenant's fourth request to wait in the worker's queue")
    assert sorted(fused4.engine.started) == ["heavy-0", "heavy-1", "heavy-2", "light-1"]

    fused4.request("light-2", light)
    fused4.run_until(lambda: "light-2" in fused4.engine.started, "the light tenant's second request to start")
    fused4.run_until(lambda: "GenerationStarted" in fused4.types(topics.OUTCOMES, "light-2"), "its start on the log")
    assert fused4.queued_anywhere("light-2") == [], "taken in admission's commit, past the heavy tenant's queued work"
    assert fused4.worker.queued == 1 and "heavy-3" not in fused4.engine.started


def test_a_failed_admission_commit_abandons_the_started_generation_and_the_retry_serves_it_once(fused, monkeypatch):
    consumer = fused.admission._consumer  # noqa: SLF001
    real_commit, failures = consumer.commit_with, []

    def failing_once(outputs, **kwargs):
        if not failures:
            failures.append(1)
            # The engine runs it while the commit is under way; then the commit fails.
            wait_until(lambda: fused.engine.started == ["retry-1"], 30, every_s=0.005,
                       what="the engine to start on it during the commit")
            raise EventLogError("the log went away mid-commit")
        return real_commit(outputs, **kwargs)
    monkeypatch.setattr(consumer, "commit_with", failing_once)

    fused.request("retry-1")
    fused.run_until(lambda: failures, "the first attempt")
    # Abandoned: out of the engine, its slot free again, nothing of it written.
    assert fused.worker.in_flight == 0 and fused.engine.started == ["retry-1"]
    fused.run_until(lambda: fused.engine.started == ["retry-1", "retry-1"], "the request, decided again, to start")
    fused.run_until(lambda: "GenerationStarted" in fused.types(topics.OUTCOMES, "retry-1"), "its start on the log")
    assert fused.types(topics.OUTCOMES, "retry-1") == ["GenerationStarted"]
    assert fused.types(topics.LEDGER, "retry-1") == ["BudgetReserved", "GenerationAdmitted"]
    assert fused.types(topics.STREAM, "retry-1") == ["GenerationStarted"]
    assert fused.worker.in_flight == 1


def test_positions_of_records_that_decide_nothing_ride_with_the_next_unit(fused, monkeypatch):
    """Admission reads back its own take, and a cancel of running work: neither decides
    anything, and neither costs a unit of its own. Their positions are committed with the
    next unit that writes something (here the settlement), or on their own once they have
    waited long enough."""
    admission = fused.admission
    admission._idle.every_s = 3600  # noqa: SLF001 - never due on its own until the end
    consumer = admission._consumer  # noqa: SLF001
    real_commit, units = consumer.commit_with, []

    def counting(outputs, **kwargs):
        units.append(len(outputs))
        return real_commit(outputs, **kwargs)
    monkeypatch.setattr(consumer, "commit_with", counting)

    def record(topic, request_id: str, event_type: str):
        [(found, _)] = [(r, env) for r, env in request_events(fused.log, request_id, topic)
                        if env.event_type == event_type]
        return found

    def committed_past(found) -> bool:
        return (consumer.committed(found.topic, found.partition) or 0) > found.offset

    fused.request("quiet-1")
    fused.run_until(lambda: "GenerationStarted" in fused.types(topics.OUTCOMES, "quiet-1"), "its start on the log")
    started = record(topics.OUTCOMES, "quiet-1", "GenerationStarted")
    fused.cancel("quiet-1")
    fused.run_until(lambda: "GenerationCancelled" in fused.types(topics.OUTCOMES, "quiet-1"), "the cancel to end it")
    cancel = record(topics.REQUESTS, "quiet-1", "CancelRequested")
    assert not committed_past(started) and not committed_past(cancel), "nothing was committed for them alone"

    fused.run_until(lambda: "UsageSettled" in fused.types(topics.LEDGER, "quiet-1"), "the settlement")
    assert committed_past(started) and committed_past(cancel), "committed with the settlement"
    assert 0 not in units, f"no unit of its own for a record that decided nothing: {units}"

    admission._idle.every_s = 0.0  # noqa: SLF001
    fused.cancel("quiet-1")  # again: it has ended, so this decides nothing either
    [late] = [r for r, env in request_events(fused.log, "quiet-1", topics.REQUESTS)
              if env.event_type == "CancelRequested" and r.offset > cancel.offset]
    fused.run_until(lambda: committed_past(late), "the late cancel's position, on its own once it has waited")
    assert units[-1] == 0


def test_a_settlement_waits_for_the_next_decision_and_goes_out_with_it(fused, monkeypatch):
    """Nobody waits on a settlement: the book releases the reservation as it settles, so
    the next request is decided as if the settlement were written, and both go out in one
    unit. With no request coming, a settlement goes out on its own after a short linger."""
    admission = fused.admission
    admission.SETTLE_LINGER_S = 3600.0  # until the next decision
    admin.set_limits(admission._registry_view, tenant_id=fused.tenant, actor="tests", max_concurrent=1)  # noqa: SLF001
    consumer = admission._consumer  # noqa: SLF001
    real_commit, units = consumer.commit_with, []

    def recording(outputs, **kwargs):
        units.append(sorted({m.value.split(b'"event_type":"')[1].split(b'"')[0].decode() for _, m in outputs}))
        return real_commit(outputs, **kwargs)
    monkeypatch.setattr(consumer, "commit_with", recording)

    fused.request("owed-1")
    fused.run_until(lambda: "GenerationStarted" in fused.types(topics.OUTCOMES, "owed-1"), "the first to start")
    fused.cancel("owed-1")
    fused.run_until(lambda: "GenerationCancelled" in fused.types(topics.OUTCOMES, "owed-1"), "the first to end")
    for _ in range(10):
        fused.run_until(lambda: True, "a round")
    assert "UsageSettled" not in fused.types(topics.LEDGER, "owed-1"), "the settlement waits"

    # One concurrent request allowed: the second is admitted, since the first is settled
    # in the book, and the settlement is written with it.
    fused.request("owed-2")
    fused.run_until(lambda: "GenerationStarted" in fused.types(topics.OUTCOMES, "owed-2"), "the second to start")
    assert fused.types(topics.LEDGER, "owed-2") == ["BudgetReserved", "GenerationAdmitted"]
    assert fused.types(topics.LEDGER, "owed-1")[-2:] == ["UsageSettled", "ReservationReleased"]
    assert {"UsageSettled", "ReservationReleased", "BudgetReserved", "GenerationAdmitted"} <= set(units[-1]), units

    admission.SETTLE_LINGER_S = 0.2
    fused.cancel("owed-2")
    fused.run_until(lambda: "UsageSettled" in fused.types(topics.LEDGER, "owed-2"), "the second's settlement, alone")
    assert set(units[-1]) == {"UsageSettled", "ReservationReleased"}, units


def test_a_lingering_settlement_goes_out_when_due_however_long_a_quiet_poll_would_wait(fused):
    """`ledgerlm serve admission` polls for up to half a second: a settlement read in a quiet
    spell is still written once it has lingered its `SETTLE_LINGER_S`, not at the poll's end."""
    admission = fused.admission
    admission.SETTLE_LINGER_S = 3600.0  # held until it is told otherwise below
    fused.request("due-1")
    fused.run_until(lambda: "GenerationStarted" in fused.types(topics.OUTCOMES, "due-1"), "the request to start")
    fused.cancel("due-1")
    fused.run_until(lambda: admission._settling, "admission to hold the settlement")  # noqa: SLF001
    assert "UsageSettled" not in fused.types(topics.LEDGER, "due-1")
    admission.SETTLE_LINGER_S = 0.3
    began = time.monotonic()
    wait_until(lambda: admission.run_once(30.0) is not None and "UsageSettled" in fused.types(topics.LEDGER, "due-1"),
               20, every_s=0, what="the settlement")
    assert time.monotonic() - began < 10, "written when due, not when a 30 s poll ended"


def test_an_idle_admission_makes_no_looks_at_the_admin_topic(fused):
    """Only decisions on records read the registry: a poll that brings nothing asks the log
    nothing about the admin topic (on Kafka, a round trip each)."""
    fused.request("look-1")
    fused.run_until(lambda: "GenerationStarted" in fused.types(topics.OUTCOMES, "look-1"), "a first decision")
    view = fused.admission._registry_view  # noqa: SLF001
    fused.run_until(lambda: (fused.admission.run_once(0.02), fused.admission.run_once(0.02)) == (0, 0),
                    "admission to have read everything")
    looks = view.checks
    for _ in range(10):
        assert fused.admission.run_once(0.02) == 0
    assert view.checks == looks
    fused.cancel("look-1")
    fused.run_until(lambda: view.checks > looks, "a look for the cancel's unit")
