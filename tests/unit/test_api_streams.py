"""A request's stream read from history then live, each event once and in order; the
request index's status, claims and read-your-writes, over an in-memory log; metrics."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import ApiMetrics
from api.request_stream import RequestStream, StreamTimeout
from models import topics
from models.events import encode, new_event
from models.events_generation import GenerationRequested, GenerationStarted, Position, TokensEmitted
from pipelines.eventlog import EventLog, Message, Record, partition_for
from pipelines.generation.request_index import RequestIndex
from tests.unit.test_api_units import STREAM


class FakeSub:
    tenant_id, request_id = "t", "r"

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.closed = False

    def close(self):
        self.closed = True


def test_history_then_live_gives_each_event_once_in_order():
    async def run():
        sub = FakeSub()
        for event in STREAM[1:]:  # live copies of what history also has, and more
            sub.queue.put_nowait(event)
        stream = RequestStream(sub, after=2)
        stream.add_history(STREAM[:3])
        got = [e.offset async for e in stream.events(5)]
        stream.close()
        return got, sub.closed

    got, closed = asyncio.run(run())
    assert got == [3, 5, 6, 9] and closed


def test_a_silent_stream_times_out():
    async def run():
        stream = RequestStream(FakeSub(), after=0)
        with pytest.raises(StreamTimeout):
            await stream.next(0.01)

    asyncio.run(run())


def test_tracker_measures_one_generation():
    metrics = ApiMetrics()
    tracker = metrics.track("tenant-a", "interactive-normal", started_at=0.0)
    tracker.describe("tiny@1", 12)
    for event in STREAM:
        tracker.on_event(event)
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in text_string_to_metric_families(metrics.render()[0].decode()) for s in f.samples}
    pool = (("pool", "interactive-normal"), ("prompt_class", "short"), ("revision", "tiny@1"))
    assert found[("ledgerlm_ttft_seconds_count", pool)] == 1
    assert found[("ledgerlm_inter_token_seconds_count", pool)] == 1
    assert found[("ledgerlm_e2e_seconds_count", pool)] == 1
    assert found[("ledgerlm_tokens_total", (("kind", "output"), ("tenant", "tenant-a")))] == 2
    assert found[("ledgerlm_in_flight_requests", (("tenant", "tenant-a"),))] == 0
    assert found[("ledgerlm_admission_decisions_total", (("decision", "admitted"), ("reason", "")))] == 1


def test_every_token_after_the_first_is_one_inter_token_gap_however_events_group_them():
    from tests.unit.test_api_units import ev

    metrics = ApiMetrics()
    tracker = metrics.track("tenant-a", "interactive-normal", started_at=0.0)
    tracker.describe("tiny@1", 12)
    for event in [STREAM[0], ev(5, TokensEmitted(request_id="r", seq=0, text="abc", token_count=3)),
                  ev(6, TokensEmitted(request_id="r", seq=1, text="de", token_count=2))]:
        tracker.on_event(event)
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in text_string_to_metric_families(metrics.render()[0].decode()) for s in f.samples}
    pool = (("pool", "interactive-normal"), ("prompt_class", "short"), ("revision", "tiny@1"))
    assert found[("ledgerlm_inter_token_seconds_count", pool)] == 4
    # The first event's two later tokens reached the client with the first one: no wait.
    assert found[("ledgerlm_inter_token_seconds_bucket", (("le", "0.001"),) + pool)] >= 2


class MemoryLog(EventLog):
    """Just enough of an event log, in memory, with controllable timestamps."""

    def __init__(self):
        self.records: dict[tuple[str, int], list[Record]] = {}
        self.now_ms = 0

    def ensure_topics(self, specs):
        pass

    def partitions(self, topic):
        return next(t.partitions for t in topics.ALL if t.name == topic)

    def append(self, topic, messages):
        out = []
        for m in messages:
            p = partition_for(m.key, self.partitions(topic)) if m.partition is None else m.partition
            part = self.records.setdefault((topic, p), [])
            part.append(Record(topic, p, len(part), m.key, m.value, self.now_ms))
            out.append(part[-1])
        return out

    def read(self, topic, partition, offset, *, max_records=500, timeout_s=0.0):
        return self.records.get((topic, partition), [])[offset:offset + max_records]

    def end_offset(self, topic, partition):
        return len(self.records.get((topic, partition), []))

    def consumer(self, *a, **k):
        raise NotImplementedError

    def close(self):
        pass


def requested(tenant: str, request_id: str, at: datetime, key: str | None = None, body: str | None = None):
    payload = GenerationRequested(
        request_id=request_id, model_alias="tiny", model_revision="tiny@1", input_tokens=3, input_sha256="x",
        max_output_tokens=5, prompt_ref=Position(topic="p", partition=0, offset=0), stream_offset=11,
        idempotency_key_sha256=key, request_sha256=body)
    return new_event(payload, tenant_id=tenant, correlation_id=request_id, occurred_at=at)


def publish(log: MemoryLog, topic, env, at: datetime):
    log.now_ms = int(at.timestamp() * 1000)
    return log.append(topic.name, [Message(key=env.tenant_id, value=encode(env))])[0]


def test_index_reads_its_writes_and_knows_only_the_tenants_own():
    log, now = MemoryLog(), datetime.now(timezone.utc)
    index = RequestIndex(log)
    assert index.request("a", "r1") is None
    publish(log, topics.REQUESTS, requested("a", "r1", now), now)
    started = new_event(GenerationStarted(request_id="r1", worker_id="w", model_revision="tiny@1", queued_ms=4),
                        tenant_id="a", correlation_id="r1", occurred_at=now)
    publish(log, topics.OUTCOMES, started, now)
    assert index.request("a", "r1").stream_offset == 11
    assert index.status("a", "r1")["status"] == "running"
    assert index.request("b", "r1") is None and index.status("b", "r1") is None


def test_index_claims_a_key_first_come_and_frees_it_after_the_window():
    log, now = MemoryLog(), datetime.now(timezone.utc)
    index = RequestIndex(log)
    first = publish(log, topics.REQUESTS, requested("a", "r1", now, key="k", body="b1"), now)
    publish(log, topics.REQUESTS, requested("a", "r1", now, key="k", body="b2"), now)  # a racing duplicate
    claim = index.claim("a", "k")
    assert (claim.request_id, claim.request_sha256, claim.offset) == ("r1", "b1", first.offset)
    later = now + timedelta(hours=25)
    publish(log, topics.REQUESTS, requested("a", "r2", later, key="k", body="b3"), later)
    assert index.claim("a", "k").request_id == "r2"


def test_index_starts_at_the_window_when_the_log_is_older():
    log, now = MemoryLog(), datetime.now(timezone.utc)
    for hours in range(100, 0, -1):
        at = now - timedelta(hours=hours)
        publish(log, topics.REQUESTS, requested("a", f"r{hours}", at), at)
    index = RequestIndex(log)
    assert index.request("a", "r30") is None, "older than the window: the projection's business"
    assert index.request("a", "r24") is not None and index.request("a", "r1") is not None
