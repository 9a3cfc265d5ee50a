"""Admission's run loop rides out a log that fails mid-unit (what a frozen or stopped broker
does: a timeout in `commit_with`, then in the seek back) and decides and settles every
request exactly once when the log answers again. The failures are injected into the
consumer of an embedded log; `tests/e2e/test_log_outage.py` does it to a real broker."""
from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

from kafka import errors as kerr

from models import topics
from models.events import decode, new_event
from models.events_generation import GenerationCompleted, GenerationRequested, Position, Timings
from pipelines.admin import commands as admin
from pipelines.admin.commands import RegistryView
from pipelines.admission.processor import AdmissionProcessor
from pipelines.eventlog import open_event_log
from pipelines.bootstrap import topic_specs
from pipelines.outage import Readiness
from pipelines.publish import publish
from tests.harness import new_tenant
from tests.helpers import wait_until

REV = "tiny@outage"


class FlakyConsumer:
    """A group consumer whose next `fail_commits` commits and `fail_seeks` seeks time out."""

    def __init__(self, inner, *, fail_commits: int, fail_seeks: int):
        self._inner, self.fail_commits, self.fail_seeks = inner, fail_commits, fail_seeks

    def commit_with(self, *args, **kwargs):
        if self.fail_commits:
            self.fail_commits -= 1
            raise kerr.KafkaTimeoutError("broker frozen: transaction step begin_commit did not finish")
        return self._inner.commit_with(*args, **kwargs)

    def seek_to_committed(self):
        if self.fail_seeks:
            self.fail_seeks -= 1
            raise kerr.KafkaTimeoutError("broker frozen: committed offsets unknown")
        return self._inner.seek_to_committed()

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _requested(tenant_id: str, request_id: str) -> object:
    req = GenerationRequested(
        request_id=request_id, model_alias="tiny", model_revision=REV, input_tokens=5, input_sha256="0" * 64,
        max_output_tokens=5, deadline_at=datetime.now(timezone.utc) + timedelta(minutes=5),
        prompt_ref=Position(topic="p", partition=0, offset=0))
    return new_event(req, tenant_id=tenant_id, correlation_id=request_id)


def _ledger(log, request_id: str) -> list[str]:
    return [e.event_type for e in (decode(r.value) for r in log.read_topic(topics.LEDGER.name))
            if e.correlation_id == request_id]


def test_admission_waits_out_a_failing_log_and_decides_and_settles_each_request_once(tmp_path):
    log = open_event_log(f"sqlite:///{tmp_path / 'eventlog.db'}")
    log.ensure_topics(topic_specs())
    view = RegistryView(log)
    tenant_id, _ = new_tenant(view)
    admin.approve_model(view, alias="tiny", model_revision=REV, model_path="/m", engine_config_hash="x",
                        max_model_len=512, actor="tests")
    processor = AdmissionProcessor(log, RegistryView(log), grace=timedelta(seconds=5), lost_after_s=None)
    processor._consumer = flaky = FlakyConsumer(processor._consumer, fail_commits=3, fail_seeks=2)  # noqa: SLF001
    readiness, stop = Readiness("admission"), threading.Event()
    errors: list[BaseException] = []

    def run():
        try:
            processor.run(stop, readiness)
        except BaseException as exc:  # surfaced below: the loop must not end on an outage
            errors.append(exc)

    thread = threading.Thread(target=run, name="admission", daemon=True)
    thread.start()
    try:
        ids = [f"req-{i}" for i in range(4)]
        publish(log, topics.REQUESTS, [_requested(tenant_id, rid) for rid in ids])
        wait_until(lambda: not readiness.ready or errors, 20, what="admission to meet the failing log")
        wait_until(lambda: all("BudgetReserved" in _ledger(log, rid) for rid in ids) or errors, 30,
                   what="every request decided once the log answers")
        assert not errors and thread.is_alive(), errors
        assert flaky.fail_commits == 0 and flaky.fail_seeks == 0
        wait_until(lambda: readiness.ready, 10, what="admission ready again")
        publish(log, topics.OUTCOMES, [new_event(GenerationCompleted(
            request_id=rid, finish_reason="length", input_tokens=5, output_tokens=5, model_revision=REV,
            output_sha256="x", timings=Timings()), tenant_id=tenant_id, correlation_id=rid) for rid in ids])
        wait_until(lambda: all("ReservationReleased" in _ledger(log, rid) for rid in ids), 30,
                   what="every reservation settled")
        for rid in ids:
            assert _ledger(log, rid) == ["BudgetReserved", "GenerationAdmitted", "UsageSettled",
                                         "ReservationReleased"], (rid, _ledger(log, rid))
        assert readiness.outages >= 1
    finally:
        stop.set()
        thread.join(10)
        processor.close()
        log.close()
