"""The batch dispatcher and chunk runner against the embedded log and an in-memory object
store, with a fake engine and a queue the test drives: the paths that are hard to time
on real services (window expiry, failed units redone, restarts, reports out of order,
chunks failing for good)."""
from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from models.batch_budget import BatchLimits
from models.events import decode
from models.events_batch import (
    BatchChunkCompleted, BatchChunkQueued, BatchChunkStarted, BatchEngineStarted, BatchEngineStarting, BatchUsageSettled,
)
from models.registry import Principal
from pipelines.admin.commands import RegistryView, approve_model, create_tenant
from pipelines.batch.dispatcher import BatchDispatcher
from pipelines.batch.reconcile import DispatchOptions
from pipelines.batch.submit import SubmitBatch, submit_batch, upload_file
from pipelines.batch.view import BatchView
from pipelines.bootstrap import topic_specs
from pipelines.eventlog import open_event_log
from pipelines.objectstore import open_object_store
from workers.batch_engine import EngineSlot, GenResult
from workers.batch_runner import ChunkTask, report_failure, run_chunk
from workers.vllm_engine import VllmEngineConfig, engine_config_hash

TENANT = "acme"
PRINCIPAL = Principal(TENANT, "default", "key_1", frozenset({"batch"}))


class FakeEngine:
    calls = 0

    def generate(self, requests, *, tenant_id):
        FakeEngine.calls += 1
        return [GenResult("ok", list(r.prompt_token_ids[:r.max_tokens]), "length", len(r.prompt_token_ids))
                for r in requests]

    def close(self):
        pass


class Queue:
    """Holds the dispatcher's tasks until the test runs them; can fail an enqueue."""

    def __init__(self):
        self.tasks, self.sent, self.fail_next = [], Counter(), 0

    def enqueue(self, task):
        self.sent[(task["batch_id"], task["chunk_index"])] += 1
        self.tasks.append(task)
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("broker went away")

    def close(self):
        pass


class Clock:
    def __init__(self):
        self.now = datetime.now(timezone.utc)

    def __call__(self):
        return self.now


@pytest.fixture
def rig(tmp_path, tiny_model_dir):
    log = open_event_log(f"sqlite:///{tmp_path / 'log.db'}")
    log.ensure_topics(topic_specs())
    view = RegistryView(log)
    config_hash = engine_config_hash(VllmEngineConfig(model=tiny_model_dir, max_model_len=512))
    approve_model(view, alias="tiny", model_revision=f"tiny@{config_hash}", model_path=str(tiny_model_dir),
                  engine_config_hash=config_hash, max_model_len=512, actor="t", price_output_per_1k_micros=1000)
    create_tenant(view, tenant_id=TENANT, name=TENANT, actor="t")

    class Rig:
        store = open_object_store(f"memory://{uuid.uuid4().hex}")
        queue, clock, batches = Queue(), Clock(), BatchView(log)
        slot = EngineSlot({}, factory=lambda config: FakeEngine())

        def dispatcher(self):
            return BatchDispatcher(log, RegistryView(log), self.store, self.queue, clock=self.clock,
                                   options=DispatchOptions(chunk_size=2, chunks_in_flight=2),
                                   limits_for=lambda t, r: BatchLimits())

        def submit(self, lines):
            path = tmp_path / f"{uuid.uuid4().hex}.jsonl"
            path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
            f = upload_file(principal=PRINCIPAL, store=self.store, log=log, filename="in.jsonl", purpose="batch",
                            local_path=str(path), max_bytes=10**6)
            return submit_batch(SubmitBatch(f.file_id, "/v1/chat/completions"), principal=PRINCIPAL,
                                view=self.batches, store=self.store, log=log).batch_id

        def run_task(self, task):
            return run_chunk(ChunkTask(**task), store=self.store, log=log, engines=self.slot, worker_id="w1",
                             attempt=1)

        def drive(self, dispatcher, batch_id, *, run_tasks=True, until=None, steps=200):
            """Dispatcher passes (and queued tasks) until `until(batch)` or the batch ends."""
            for _ in range(steps):
                dispatcher.run_once(0.01)
                while run_tasks and self.queue.tasks:
                    self.run_task(self.queue.tasks.pop(0))
                batch = self.batches.batch(TENANT, batch_id)
                if (until or (lambda b: b.terminal))(batch):
                    return batch
            raise AssertionError(f"batch {batch_id} did not get there: {batch}")

        def events(self, batch_id):
            partition = next(p for p in range(8) if log.read("ledgerlm.batches", p, 0))
            return [e for r in log.read_partition("ledgerlm.batches", partition)
                    if getattr((e := decode(r.value)).payload, "batch_id", None) == batch_id]

        def lines_of(self, file_id):
            state = self.batches.file(TENANT, file_id)
            return [json.loads(x) for x in self.store.get_bytes(state.object_key).splitlines()] if state else []

    yield Rig()
    log.close()


def line(i, **body):
    return {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 4, **body}}


def of(events, kind):
    return [e.payload for e in events if isinstance(e.payload, kind)]


def test_a_batch_past_its_window_expires_with_unrun_requests_in_the_error_file(rig):
    dispatcher = rig.dispatcher()
    batch_id = rig.submit([line(i) for i in range(6)])
    rig.drive(dispatcher, batch_id, run_tasks=False, until=lambda b: len(b.in_flight()) == 2)
    rig.run_task(rig.queue.tasks.pop(0))
    rig.queue.tasks.clear()  # the other queued chunk's task is lost with its broker
    rig.clock.now += timedelta(hours=25)
    batch = rig.drive(dispatcher, batch_id, run_tasks=False)
    assert batch.status == "expired" and batch.times.get("expired_at")
    assert {e["error"]["code"] for e in rig.lines_of(batch.error_file_id)} == {"batch_expired"}
    done = {x["custom_id"] for x in rig.lines_of(batch.output_file_id)}
    failed = {x["custom_id"] for x in rig.lines_of(batch.error_file_id)}
    assert len(done) == 2 and done | failed == {f"r{i}" for i in range(6)} and not done & failed
    settled = Counter(p.reservation_id for p in of(rig.events(batch_id), BatchUsageSettled))
    assert settled == Counter(p.reservation_id for p in of(rig.events(batch_id), BatchChunkQueued))


@pytest.mark.parametrize("lines, codes", [(["not json", "{}"], ["invalid_json", "invalid_request"]),
                                          ([line(0, model="unknown")], ["model_not_found"]),
                                          ([line(0, max_tokens=5000)], ["context_length_exceeded"])])
def test_an_input_without_any_usable_request_fails_the_batch_with_an_error_file(rig, lines, codes):
    batch = rig.drive(rig.dispatcher(), rig.submit(lines))
    assert batch.status == "failed" and batch.errors[0].code == "no_valid_requests" and batch.times.get("failed_at")
    assert batch.request_counts.total == batch.request_counts.failed == len(lines)
    assert [e["error"]["code"] for e in rig.lines_of(batch.error_file_id)] == codes
    assert not rig.queue.sent


def test_a_unit_that_failed_midway_is_redone_without_reserving_twice(rig):
    dispatcher = rig.dispatcher()
    rig.queue.fail_next = 1  # the second send of the first pass fails: nothing of it is committed
    batch_id = rig.submit([line(i) for i in range(8)])
    batch = rig.drive(dispatcher, batch_id)
    assert batch.status == "completed" and batch.request_counts.completed == 8
    queued = Counter(p.chunk_index for p in of(rig.events(batch_id), BatchChunkQueued))
    assert queued == Counter({0: 1, 1: 1, 2: 1, 3: 1}) and rig.queue.sent[(batch_id, 0)] == 2
    assert sorted(x["custom_id"] for x in rig.lines_of(batch.output_file_id)) == [f"r{i}" for i in range(8)]


def test_a_new_dispatcher_carries_on_from_the_log(rig):
    first = rig.dispatcher()
    batch_id = rig.submit([line(i) for i in range(8)])
    rig.drive(first, batch_id, run_tasks=False, until=lambda b: len(b.in_flight()) == 2)
    first.close()
    batch = rig.drive(rig.dispatcher(), batch_id)
    assert batch.status == "completed"
    assert Counter(p.chunk_index for p in of(rig.events(batch_id), BatchChunkQueued)) == Counter(range(4))


def test_a_chunk_reported_before_the_dispatcher_committed_its_queueing_still_settles_once(rig):
    dispatcher = rig.dispatcher()
    rig.queue.enqueue = lambda task: rig.run_task(task)  # the worker finishes before the commit
    batch_id = rig.submit([line(i) for i in range(4)])
    batch = rig.drive(dispatcher, batch_id)
    events = rig.events(batch_id)
    kinds = [type(e.payload).__name__ for e in events]
    assert kinds.index("BatchChunkCompleted") < kinds.index("BatchChunkQueued")
    assert batch.status == "completed" and batch.request_counts.completed == 4
    assert len(of(events, BatchUsageSettled)) == 2


def test_a_retry_that_finds_its_part_written_reports_it_without_running_again(rig):
    dispatcher = rig.dispatcher()
    batch_id = rig.submit([line(i) for i in range(2)])
    rig.drive(dispatcher, batch_id, run_tasks=False, until=lambda b: b.in_flight())
    task = rig.queue.tasks.pop(0)
    calls = FakeEngine.calls
    assert rig.run_task(task) == rig.run_task(task) == "completed"
    assert FakeEngine.calls == calls + 1
    events = rig.events(batch_id)
    assert len(of(events, BatchChunkStarted)) == 1 and len(of(events, BatchChunkCompleted)) == 2
    assert rig.drive(dispatcher, batch_id).request_counts.completed == 2


def test_a_chunk_that_failed_for_good_reports_its_requests_failed(rig):
    dispatcher = rig.dispatcher()
    batch_id = rig.submit([line(i) for i in range(4)])
    rig.drive(dispatcher, batch_id, run_tasks=False, until=lambda b: len(b.in_flight()) == 2)
    broken = ChunkTask(**rig.queue.tasks.pop(0))
    report_failure(rig.batches._log, broken, "chunk_failed", "RuntimeError: engine died", "w1")  # noqa: SLF001
    batch = rig.drive(dispatcher, batch_id)
    assert batch.status == "completed" and batch.request_counts.completed == 2
    assert [e["error"]["code"] for e in rig.lines_of(batch.error_file_id)] == ["chunk_failed"] * 2
    settled = of(rig.events(batch_id), BatchUsageSettled)
    assert {p.chunk_index: p.input_tokens + p.output_tokens == 0 for p in settled}[broken.chunk_index]


def test_the_batch_says_starting_the_engine_while_its_worker_makes_one_and_not_after(rig):
    seen = []

    def make_engine(config):
        # What a client polling the API reads while the worker is loading the model.
        seen.append(rig.batches.batch(TENANT, batch_id).status_detail)
        return FakeEngine()

    rig.slot = EngineSlot({}, factory=make_engine)
    batch_id = rig.submit([line(i) for i in range(6)])
    dispatcher = rig.dispatcher()
    running = rig.drive(dispatcher, batch_id, run_tasks=False, until=lambda b: len(b.in_flight()) == 2)
    assert running.status_detail is None, "queued chunks start no engine of themselves"
    batch = rig.drive(dispatcher, batch_id)
    assert batch.status == "completed" and seen == ["starting the batch engine"]
    assert batch.status_detail is None
    events = rig.events(batch_id)
    starts = [(type(e.payload).__name__, e.payload.chunk_index) for e in events
              if isinstance(e.payload, (BatchEngineStarting, BatchEngineStarted))]
    assert starts == [("BatchEngineStarting", 0), ("BatchEngineStarted", 0)], "the warm engine served the rest"
    first_run = next(i for i, e in enumerate(events) if isinstance(e.payload, BatchChunkCompleted))
    assert first_run > next(i for i, e in enumerate(events) if isinstance(e.payload, BatchEngineStarted))
