"""The pool worker's queue: deadlines end work (queued or running), a cancel ends queued
work before it starts, and a dedicated pool's worker takes only its pool's work. A fake
engine stands in for vLLM; both event logs."""
from __future__ import annotations

import uuid

import pytest

from models import topics
from models.events import decode, new_event
from models.events_generation import CancelRequested
from pipelines.eventlog import EventLogError
from pipelines.publish import publish
from tests.helpers import wait_until
from tests.conftest import make_log_opener
from tests.fake_engine import FakeEngine, outcomes, queue_work, run_until
from workers.engine_runner import EngineRunner
from workers.interactive import InteractiveWorker


@pytest.fixture(params=["embedded", "kafka"])
def opened(request, tmp_path):
    open_log = make_log_opener(request.param, tmp_path)
    logs, runners, workers = [], [], []

    def make(*, hold: bool, capacity: int = 2, pool: str | None = None):
        runner = EngineRunner(FakeEngine(hold=hold)).start()
        log = open_log()
        worker = InteractiveWorker(log, runner, runner.engine, max_in_flight=capacity, pool=pool,
                                   worker_id=f"w-{uuid.uuid4().hex[:6]}")
        logs.append(log), runners.append(runner), workers.append(worker)
        return log, runner.engine, worker

    yield make
    for worker in workers:
        worker._cancels.stop()
        worker._consumer.close()
    for runner in runners:
        runner.close()
    for log in logs:
        log.close()


def ends(log, request_id: str) -> list:
    return [e for e in outcomes(log).get(request_id, []) if e.event_type != "GenerationStarted"]


def test_running_work_is_stopped_at_its_deadline(opened):
    log, engine, worker = opened(hold=True)
    run_until(worker, lambda: worker._consumer.assignment(), "the worker to join its group")
    queue_work(log, "acme", "slow-1", deadline_s=6.0)  # room to start on a loaded machine
    run_until(worker, lambda: engine.started == ["slow-1"], "the generation to start")
    [end] = run_until(worker, lambda: ends(log, "slow-1"), "the deadline to end the generation")
    assert end.event_type == "GenerationCancelled" and end.payload.reason == "deadline"


def test_work_whose_deadline_passed_in_the_queue_is_expired_not_run(opened):
    log, engine, worker = opened(hold=False)
    queue_work(log, "acme", "stale-1", deadline_s=-1.0)
    [end] = run_until(worker, lambda: ends(log, "stale-1"), "the stale item to end")
    assert end.event_type == "GenerationFailed" and end.payload.error_code == "deadline_expired"
    assert engine.started == []


def test_cancelled_queued_work_never_starts(opened):
    log, engine, worker = opened(hold=True, capacity=1)
    queue_work(log, "acme", "first")
    queue_work(log, "acme", "second")
    run_until(worker, lambda: engine.started == ["first"] and worker.queued == 1, "one running, one queued")
    publish(log, topics.REQUESTS, [new_event(CancelRequested(request_id="second", reason="client"),
                                             tenant_id="acme", correlation_id="second")])
    [end] = run_until(worker, lambda: ends(log, "second"), "the queued cancel to end it")
    assert end.event_type == "GenerationCancelled" and end.payload.reason == "client"
    assert end.payload.output_tokens == 0 and engine.started == ["first"]


def test_a_dedicated_pool_worker_takes_only_its_own_pool(opened):
    pool = "gold-" + uuid.uuid4().hex[:6]
    log, engine, worker = opened(hold=False, pool=pool)
    queue_work(log, "acme", "shared-1")
    for _ in range(30):
        worker.run_once(0.05)
    assert engine.started == []
    queue_work(log, "acme", "gold-1", topic=topics.work_topic(pool, "normal"))
    run_until(worker, lambda: engine.started == ["gold-1"], "the dedicated pool's work to start")


def stream_events(log, request_id: str) -> list:
    return [env for env in (decode(r.value) for r in log.read_topic(topics.STREAM.name))
            if env.correlation_id == request_id]


def fail_first_take(worker, engine, request_id: str) -> dict:
    """The worker's first take commit fails, after the engine began on `request_id` (the
    engine starts while the take commits)."""
    real, state = worker._consumer.commit_with, {"failed": False}

    def commit_with(outputs, **options):
        if outputs and not state["failed"]:
            state["failed"] = True
            wait_until(lambda: request_id in engine.started, 30, what="the engine to begin during the take")
            raise EventLogError("the take's commit failed")
        return real(outputs, **options)

    worker._consumer.commit_with = commit_with
    return state


@pytest.mark.parametrize("hold", [False, True], ids=["made-a-token", "still-running"])
def test_work_begun_during_a_failed_take_leaves_no_trace_and_runs_once_taken(opened, hold):
    log, engine, worker = opened(hold=hold)
    state = fail_first_take(worker, engine, "retaken-1")
    queue_work(log, "acme", "retaken-1")
    run_until(worker, lambda: state["failed"], "the failing take")
    # Taken again from the committed positions, once the abandoned generation left the engine.
    run_until(worker, lambda: engine.started == ["retaken-1", "retaken-1"], "the work to be taken again")
    if not hold:
        # Its end goes to the outcomes topic first, then to the stream: wait for the stream's.
        stream = run_until(worker, lambda: [e.event_type for e in stream_events(log, "retaken-1")
                                            if e.event_type == "GenerationCompleted"]
                           and stream_events(log, "retaken-1"), "the retaken work to end on its stream")
        assert [e.event_type for e in stream] == [
            "GenerationStarted", "TokensEmitted", "GenerationCompleted"], "the abandoned run wrote something"
    assert [e.event_type for e in outcomes(log)["retaken-1"]] == (
        ["GenerationStarted"] if hold else ["GenerationStarted", "GenerationCompleted"])
    # The slot of a generation that ended is freed once it has written its end; the
    # abandoned one must not keep one for good.
    run_until(worker, lambda: worker.in_flight == (1 if hold else 0), "the slots to settle")


def test_the_take_spans_no_stream_partition_and_the_stream_still_opens_with_the_start(opened):
    # On Kafka a transaction open on a stream partition would hide every other stream's
    # later tokens there until its markers land: the stream copy of GenerationStarted is
    # written after the take commits, ahead of the generation's tokens.
    log, engine, worker = opened(hold=True)
    real, taken_topics = worker._consumer.commit_with, []

    def commit_with(outputs, **options):
        taken_topics.append({topic for topic, _ in outputs})
        return real(outputs, **options)

    worker._consumer.commit_with = commit_with
    queue_work(log, "acme", "opened-1")
    run_until(worker, lambda: engine.started == ["opened-1"], "the generation to start")
    started = run_until(worker, lambda: stream_events(log, "opened-1"), "the start on the stream")
    assert [e.event_type for e in started] == ["GenerationStarted"], "announced before any token"
    assert taken_topics and all(topics.STREAM.name not in t for t in taken_topics), taken_topics
    assert any(topics.OUTCOMES.name in t for t in taken_topics), "the take itself is committed with the work"


def test_reading_back_its_own_take_costs_the_worker_no_unit_of_its_own(opened, monkeypatch):
    """A take writes the item's start to the work topic too (so a later owner of the
    partition knows it was taken); reading it back moves the worker's positions but decides
    nothing. The positions wait for the next take, or commit on their own after a while."""
    monkeypatch.setattr(InteractiveWorker, "IDLE_POSITIONS_S", 3600.0)
    log, engine, worker = opened(hold=True, capacity=3)
    consumer = worker._consumer
    real_commit, units = consumer.commit_with, []

    def counting(outputs, **kwargs):
        units.append(len(outputs))
        return real_commit(outputs, **kwargs)
    monkeypatch.setattr(consumer, "commit_with", counting)

    def start_copy(request_id: str):
        found = [r for r in log.read_topic(topics.WORK_NORMAL.name)
                 if (env := decode(r.value)).event_type == "GenerationStarted" and env.correlation_id == request_id]
        return found[0] if found else None

    def committed_past(record) -> bool:
        return (consumer.committed(record.topic, record.partition) or 0) > record.offset

    run_until(worker, lambda: worker._consumer.assignment(), "the worker to join its group")
    queue_work(log, "acme", "mine-1")
    run_until(worker, lambda: engine.started == ["mine-1"], "the first to start")
    first = run_until(worker, lambda: start_copy("mine-1"), "its start on the work topic")
    for _ in range(20):  # it reads its start back meanwhile
        worker.run_once(0.02)
    assert not committed_past(first) and 0 not in units, units

    queue_work(log, "acme", "mine-2")
    run_until(worker, lambda: engine.started == ["mine-1", "mine-2"], "the second to start")
    second = run_until(worker, lambda: start_copy("mine-2"), "its start on the work topic")
    assert committed_past(first), "the first start's position went with the second take"
    assert 0 not in units, units

    worker._idle.every_s = 0.0
    run_until(worker, lambda: committed_past(second), "the second start's position, on its own after a while")
    assert units[-1] == 0
