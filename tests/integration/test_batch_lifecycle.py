"""Batches that do not simply run to the end: cancelled mid-job, a Celery worker process
killed mid-chunk, a tenant running out of batch budget. Real Redis, S3 and Celery."""
from __future__ import annotations

import os
import signal
from collections import Counter


from models.events_batch import (
    BatchCancelRequested, BatchChunkCompleted, BatchChunkQueued, BatchChunkSkipped, BatchChunkStarted,
    BatchUsageSettled,
)
from pipelines.batch.tokens import encode_chat, tokenizer_for
from tests.helpers import wait_until
from tests.integration.test_batch_api import jsonl, lines_of, request_line, upload

pytest_plugins = ["tests.integration.batch_fixtures"]
CHUNK = 4  # the test platform's chunk size


def create(client, lines):
    file = upload(client, jsonl(lines))
    return client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")


def of_batch(events, batch_id, kind):
    return [(offset, env.payload) for offset, env in events
            if isinstance(env.payload, kind) and env.payload.batch_id == batch_id]


def long_lines(n: int, max_tokens: int) -> list[dict]:
    return [request_line(f"r{i:02d}", f"Line {i}", max_tokens=max_tokens, ignore_eos=True) for i in range(n)]


def assert_every_id_once(client, done, ids):
    seen = Counter(line["custom_id"] for line in lines_of(client, done.output_file_id) +
                   lines_of(client, done.error_file_id))
    assert seen == Counter(ids), "every custom_id exactly once across output and error files"


def assert_settled_once(events, batch_id):
    """Every reservation settled exactly once, at what its chunk used (0 if it never ran)."""
    queued = {p.reservation_id: p for _, p in of_batch(events, batch_id, BatchChunkQueued)}
    settled = Counter(p.reservation_id for _, p in of_batch(events, batch_id, BatchUsageSettled))
    assert settled == Counter(queued.keys())
    used = {}
    for _, p in of_batch(events, batch_id, BatchChunkCompleted):
        used.setdefault(p.chunk_index, p.input_tokens + p.output_tokens)
    for _, p in of_batch(events, batch_id, BatchUsageSettled):
        assert p.input_tokens + p.output_tokens == used.get(p.chunk_index, 0)
        assert p.input_tokens + p.output_tokens + p.released_tokens == queued[p.reservation_id].tokens
    return settled


def test_cancel_mid_job_stops_new_chunks_and_settles_what_ran(batch_platform):
    tenant, secret = batch_platform.tenant()
    client = batch_platform.openai(secret)
    lines = long_lines(6 * CHUNK, max_tokens=160)
    batch = create(client, lines)
    wait_until(lambda: of_batch(batch_platform.events(tenant), batch.id, BatchChunkCompleted), 180,
               what="the first chunk to complete")
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = batch_platform.wait_terminal(lambda: client.batches.retrieve(batch.id))
    assert done.status == "cancelled" and done.cancelling_at and done.cancelled_at
    events = batch_platform.events(tenant)
    completed = {p.chunk_index for _, p in of_batch(events, batch.id, BatchChunkCompleted)}
    assert 1 <= len(completed) < 6
    assert (done.request_counts.completed, done.request_counts.failed) == (CHUNK * len(completed),
                                                                          len(lines) - CHUNK * len(completed))
    assert_every_id_once(client, done, [line["custom_id"] for line in lines])
    assert {e["error"]["code"] for e in lines_of(client, done.error_file_id)} == {"batch_cancelled"}
    # The stop marker is written before the first skip is logged, and workers look for it
    # right before starting. Only a chunk whose worker looked just before the marker was
    # written can start after that point: with one worker running one chunk at a time, at
    # most one.
    (cancel_at, _), = of_batch(events, batch.id, BatchCancelRequested)
    first_skip = min(o for o, p in of_batch(events, batch.id, BatchChunkSkipped))
    assert first_skip > cancel_at
    assert len([p for o, p in of_batch(events, batch.id, BatchChunkStarted) if o > first_skip]) <= 1
    assert not [p for o, p in of_batch(events, batch.id, BatchChunkQueued) if o > first_skip]
    assert_settled_once(events, batch.id)
    ran = [p for _, p in of_batch(events, batch.id, BatchChunkCompleted)]
    assert done.usage.output_tokens == sum(p.output_tokens for p in {p.chunk_index: p for p in ran}.values())


def test_killed_worker_process_mid_chunk_redoes_the_chunk_without_duplicates(batch_platform):
    tenant, secret = batch_platform.tenant()
    client = batch_platform.openai(secret)
    lines = long_lines(3 * CHUNK, max_tokens=400)  # chunk 1 is killed while chunk 2 waits in the queue
    batch = create(client, lines)

    tail = batch_platform.event_tail(tenant)  # a chunk runs in about half a second: see its start quickly

    def started_chunk_1():
        return [p for _, p in of_batch(tail(), batch.id, BatchChunkStarted) if p.chunk_index == 1]

    (victim,) = wait_until(started_chunk_1, 180, every_s=0.01, what="chunk 1 to start")
    pid = int(victim.worker_id.rsplit(":", 1)[1])
    assert pid in batch_platform.worker.children(), "the chunk runs in the Celery worker's child process"
    os.kill(pid, signal.SIGKILL)
    assert not [p for _, p in of_batch(tail(), batch.id, BatchChunkCompleted) if p.chunk_index == 1], \
        "chunk 1 finished before the kill landed, so this run tests nothing"
    done = batch_platform.wait_terminal(lambda: client.batches.retrieve(batch.id))
    assert done.status == "completed" and done.request_counts.completed == len(lines)
    output = lines_of(client, done.output_file_id)
    assert Counter(line["custom_id"] for line in output) == Counter(line["custom_id"] for line in lines)
    assert done.error_file_id is None
    events = batch_platform.events(tenant)
    starts = [p for _, p in of_batch(events, batch.id, BatchChunkStarted) if p.chunk_index == 1]
    assert len({p.worker_id for p in starts}) >= 2, "chunk 1 ran again in a new worker process"
    completions = [p for _, p in of_batch(events, batch.id, BatchChunkCompleted) if p.chunk_index == 1]
    assert completions and victim.worker_id not in {p.worker_id for p in completions}
    assert_settled_once(events, batch.id)


def test_out_of_budget_stops_taking_chunks_and_reports_insufficient_quota_never_overrunning(batch_platform,
                                                                                        tiny_model_dir):
    tenant, secret = batch_platform.tenant()
    client = batch_platform.openai(secret)
    lines = long_lines(5 * CHUNK, max_tokens=16)
    prompt_tokens = len(encode_chat(tokenizer_for(str(tiny_model_dir)), lines[0]["body"]["messages"]))
    per_chunk = CHUNK * (prompt_tokens + 16)
    limit = 2 * per_chunk + per_chunk // 2  # room for two chunks, never a third
    batch_platform.set_batch_limit(tenant, limit)
    wait_until(lambda: batch_platform.dispatcher._registry_view.refresh().limits_for(tenant)  # noqa: SLF001
               .batch_tokens_per_window == limit, 10, what="the limit to reach the dispatcher")
    batch = create(client, lines)
    done = batch_platform.wait_terminal(lambda: client.batches.retrieve(batch.id))
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (2 * CHUNK, 3 * CHUNK)
    errors = lines_of(client, done.error_file_id)
    assert {e["error"]["code"] for e in errors} == {"insufficient_quota"} and len(errors) == 3 * CHUNK
    assert_every_id_once(client, done, [line["custom_id"] for line in lines])
    events = batch_platform.events(tenant)
    # Replaying the tenant's reservations: what was held never went past the limit.
    held, used = {}, 0
    for _, env in events:
        p = env.payload
        if isinstance(p, BatchChunkQueued):
            held[p.reservation_id] = p.tokens
            assert used + sum(held.values()) <= limit
        elif isinstance(p, BatchUsageSettled):
            held.pop(p.reservation_id)
            used += p.input_tokens + p.output_tokens
    assert used <= limit and not held
    assert len(assert_settled_once(events, batch.id)) == 2
