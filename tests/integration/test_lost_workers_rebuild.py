"""After a rebalance admission rebuilds its book from the ledger and reads back, from the
outcomes topic, which worker runs each open request: a request still running is found on
its worker, one whose end is written (not yet settled) is on none, and another tenant's
partition is not read. Both logs."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from models import topics
from models.events import new_event
from models.events_generation import BudgetReserved, GenerationCompleted, GenerationStarted, Timings
from pipelines.admission.processor import rebuild
from pipelines.eventlog import partition_for
from pipelines.admission.lost_workers import note_running
from pipelines.publish import publish
from tests.conftest import make_log_opener


@pytest.fixture(params=["embedded", "kafka"])
def log(request, tmp_path):
    handle = make_log_opener(request.param, tmp_path)()
    yield handle
    handle.close()


def test_which_worker_runs_what_is_read_back_after_a_rebuild(log):
    tenant = "t" + uuid.uuid4().hex[:8]
    now = datetime.now(timezone.utc)

    def env(payload, request_id: str, tenant_id: str = tenant):
        return new_event(payload, tenant_id=tenant_id, correlation_id=request_id, occurred_at=now)
    reserved = [env(BudgetReserved(request_id=rid, reservation_id=f"res-{rid}", tokens=10, cost_micros=0,
                                   expires_at=now + timedelta(minutes=5), model_revision="r@1"), rid)
                for rid in ("running", "ended", "moved")]
    publish(log, topics.LEDGER, reserved)
    publish(log, topics.OUTCOMES, [
        env(GenerationStarted(request_id="running", worker_id="w1", model_revision="r@1", queued_ms=0), "running"),
        env(GenerationStarted(request_id="moved", worker_id="w1", model_revision="r@1", queued_ms=0), "moved"),
        env(GenerationStarted(request_id="ended", worker_id="w1", model_revision="r@1", queued_ms=0), "ended"),
        env(GenerationCompleted(request_id="ended", finish_reason="length", input_tokens=1, output_tokens=1,
                                model_revision="r@1", output_sha256="0" * 64, timings=Timings()), "ended"),
        env(GenerationStarted(request_id="moved", worker_id="w2", model_revision="r@1", queued_ms=0), "moved"),
    ])
    mine = {partition_for(tenant, log.partitions(topics.LEDGER.name))}
    book, _ = rebuild(log, mine)
    assert set(book.open) == {"running", "ended", "moved"}
    assert note_running(log, book, mine) >= 5
    assert book.running == {"w1": {"running"}, "w2": {"moved"}}
    assert book.open["ended"].worker_id is None, "its end is read; settling it is admission's part"

    others = set(range(log.partitions(topics.LEDGER.name))) - mine
    other_book, _ = rebuild(log, others)
    assert note_running(log, other_book, others) == 0 and not other_book.running
