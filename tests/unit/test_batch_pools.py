"""Dedicated batch pools: which Celery queue a chunk goes to, what the batch says while its
pool has no batch worker, and the `serve batch-worker --pool` command line."""
from __future__ import annotations

from dataclasses import dataclass
import pytest

from api.cli.processes import _batch_worker_argv, arguments
from models.batch import BatchBook
from models.events_batch import BatchChunkStarted, BatchWaitingForPool
from models.settings import Settings
from pipelines.batch import queue as queue_mod
from pipelines.batch.queue import CeleryChunkQueue, pool_queue
from pipelines.batch.reconcile import DispatchOptions, Reconciler, pool_of
from pipelines.objectstore import open_object_store
from tests.unit.test_batch_engine_state import fold, running_batch


@dataclass
class _Limits:
    pool: str | None


class _Registry:
    """What the reconciler reads of the registry here: each tenant's `pool` limit."""

    def __init__(self, pools: dict[str, str | None]):
        self.pools = pools
        self.suspended: set[str] = set()
        self.revisions: dict = {}

    def limits_for(self, tenant_id: str) -> _Limits:
        return _Limits(self.pools.get(tenant_id))


class _Revision:
    model_revision, model_path, engine_config_hash, max_model_len = "r", "/m", "h", 512
    artifact_digests, engine_settings = None, None


def _reconciler(pool_live=None) -> Reconciler:
    return Reconciler(store=open_object_store("memory://pools"), queue=None, options=DispatchOptions(),
                      budget_of=None, limits_for=None, pool_live=pool_live)


def test_a_dedicated_pool_has_its_own_queue_beside_the_shared_one():
    assert pool_queue("batch", None) == "batch"
    assert pool_queue("batch", "gold") == "batch.pool.gold"
    assert pool_queue("batch-1a", "gold") != pool_queue("batch-1a", "silver")


def test_the_pool_comes_from_the_registry_and_the_shared_pool_is_no_pool():
    registry = _Registry({"acme": "gold", "beta": None, "gamma": "interactive"})
    assert [pool_of(registry, t) for t in ("acme", "beta", "gamma", "nobody")] == ["gold", None, None, None]


def test_a_chunk_task_names_its_tenants_pool_and_a_shared_tenants_names_none():
    batch = running_batch().batches[("acme", "b1")]
    chunk = batch.chunks[0]
    task = _reconciler()._task(batch, chunk, _Revision(), "res", _Registry({"acme": "gold"}))
    assert task["pool"] == "gold"
    shared = _reconciler()._task(batch, chunk, _Revision(), "res", _Registry({}))
    assert "pool" not in shared, "a shared chunk's task is what it was before pools (older workers read it)"


def test_the_celery_queue_sends_each_chunk_to_its_pools_queue_only(monkeypatch):
    sent = []
    queue = CeleryChunkQueue("memory://", "batch-x", chunk_time_limit_s=60)
    monkeypatch.setattr(queue._app, "send_task", lambda name, **kw: sent.append((name, kw["queue"], kw["task_id"])))
    queue.enqueue({"batch_id": "b1", "chunk_index": 0, "pool": "gold"})
    queue.enqueue({"batch_id": "b2", "chunk_index": 3})
    queue.enqueue({"batch_id": "b3", "chunk_index": 1, "pool": None})
    assert [(q, i) for _, q, i in sent] == [("batch-x.pool.gold", "b1.0"), ("batch-x", "b2.3"), ("batch-x", "b3.1")]
    queue.close()


class _Inspect:
    def __init__(self, replies):
        self.replies, self.calls = replies, 0

    def __call__(self, timeout):
        assert timeout <= 1.0, "a look for workers is bounded"
        self.calls += 1
        return self

    def active_queues(self):
        if isinstance(self.replies, Exception):
            raise self.replies
        return self.replies


def test_a_pools_worker_is_looked_for_with_a_bounded_wait_and_the_answer_is_reused(monkeypatch):
    queue = CeleryChunkQueue("redis://127.0.0.1:1/0", "batch-x", chunk_time_limit_s=60)
    inspect = _Inspect({"batch-x@h": [{"name": "batch-x"}], "batch-x.pool.gold@h": [{"name": "batch-x.pool.gold"}]})
    monkeypatch.setattr(queue._app.control, "inspect", inspect)
    assert queue.has_worker("gold") is True
    assert queue.has_worker("silver") is False, "a shared worker is no worker of any pool"
    assert queue.has_worker("gold") is True and inspect.calls == 2, "looked at once per pool, then reused"
    now = queue_mod.time.monotonic()
    monkeypatch.setattr(queue_mod.time, "monotonic", lambda: now + queue_mod.PRESENCE_TTL_S + 1)
    inspect.replies = None  # no worker answered at all
    assert queue.has_worker("gold") is False and inspect.calls == 3
    queue._seen.clear()
    inspect.replies = ConnectionError("broker away")
    assert queue.has_worker("gold") is None, "a failed look says nothing either way"
    queue.close()


def test_a_broker_without_remote_control_cannot_say_whether_a_pool_has_workers():
    queue = CeleryChunkQueue("sqla+sqlite:///:memory:", "batch-x", chunk_time_limit_s=60)
    assert queue.has_worker("gold") is None
    queue.close()


def _emitted(reconciler: Reconciler, book: BatchBook, registry) -> list:
    out = []
    reconciler._note_waiting(book.batches[("acme", "b1")], out.append, registry)
    return out


def test_a_batch_says_once_that_it_waits_for_its_pools_worker_until_a_chunk_starts():
    book, registry = running_batch(), _Registry({"acme": "gold"})
    asked = []
    reconciler = _reconciler(lambda pool: asked.append(pool) or False)
    [waiting] = _emitted(reconciler, book, registry)
    assert waiting == BatchWaitingForPool(batch_id="b1", pool="gold") and asked == ["gold"]
    state = fold(book, waiting)
    assert state.status_detail == "waiting for a batch worker of pool gold"
    assert state.status == "in_progress"
    assert _emitted(reconciler, book, registry) == [], "said once, not on every pass"
    fold(book, BatchChunkStarted(batch_id="b1", chunk_index=0, worker_id="batch.gold@h:1", attempt=1))
    assert state.status_detail is None and state.waiting_for_pool is None
    assert _emitted(reconciler, book, registry) == [], "a running chunk: a worker is there"


@pytest.mark.parametrize("pools,live", [({"acme": "gold"}, True), ({"acme": "gold"}, None), ({}, False)])
def test_nothing_is_said_with_a_live_worker_an_unknown_answer_or_the_shared_pool(pools, live):
    assert _emitted(_reconciler(lambda pool: live), running_batch(), _Registry(pools)) == []


def test_the_batch_worker_takes_a_pool_flag_and_consumes_only_that_pools_queue():
    settings = Settings(batch_queue="batch")
    shared = _batch_worker_argv(settings, arguments("batch-worker"))
    assert shared[shared.index("-Q") + 1] == "batch" and "-n" not in shared
    gold = _batch_worker_argv(settings, arguments("batch-worker", "--pool", "gold"))
    assert gold[gold.index("-Q") + 1] == "batch.pool.gold"
    assert gold[gold.index("-n") + 1] == "batch.pool.gold@%h", "named apart from the shared workers on a host"
    with pytest.raises(SystemExit) as bad:
        arguments("batch-worker", "--pool", "Gold Pool!")
    assert bad.value.code == 2

