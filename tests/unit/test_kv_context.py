"""At the API, before anything is queued: a request whose prompt plus output cannot fit the KV
cache of any live worker of its revision is a 400 `context_length_exceeded` that gives the
numbers and the largest request that fits; one that fits only the largest (idle) worker is
let through; a request without max_tokens gets what the largest cache leaves."""
from __future__ import annotations

import pytest

from models.events_fleet import Capacity
from models.fleet import WorkerState
from models import topics
from pipelines.generation.submission import SubmissionError, SubmitGeneration, _fits, largest_kv
from tests.unit.test_admission import REV, T0, registry


def worker(kv_tokens: int) -> WorkerState:
    return WorkerState(worker_id=f"w{kv_tokens}", pool=topics.SHARED_POOL, model_revision=REV, engine_config_hash="h",
                       host="h", pid=1, capacity=Capacity(max_seqs=4, kv_cache_tokens=kv_tokens, max_model_len=512),
                       heartbeat_interval_ms=1000, joined_at=T0, last_seen=T0)


class Fleet:
    def __init__(self, *sizes: int):
        self.workers = [worker(kv) for kv in sizes]

    def serves_soon(self, pool, revision):
        return bool(self.workers)

    def serving(self, *, pool=None, revision=None):
        return [w for w in self.workers if w.pool == pool and w.model_revision == revision]


def fits(input_tokens: int, max_output_tokens: int | None, fleet) -> int:
    reg = registry()
    cmd = SubmitGeneration(request_id=None, model_alias="tiny", prompt="p", max_output_tokens=max_output_tokens,
                           deadline_ms=None)
    return _fits(cmd, reg, "acme", reg.revisions[REV], input_tokens, fleet)


def test_too_long_for_every_workers_kv_is_a_400_with_the_numbers():
    with pytest.raises(SubmissionError) as refused:
        fits(200, 200, Fleet(256, 300))
    error = refused.value
    assert (error.status, error.code, error.param) == (400, "context_length_exceeded", "max_tokens")
    message = str(error)
    for figure in ("200 input tokens", "200 output tokens", "= 400", REV, "largest holds 300 tokens",
                   "largest request that fits is 300 tokens", "max_tokens 100 at most"):
        assert figure in message, (figure, message)


def test_a_prompt_alone_too_long_for_every_cache_is_refused_naming_the_input():
    with pytest.raises(SubmissionError) as refused:
        fits(300, 10, Fleet(300))
    assert refused.value.param == "input" and "largest holds 300 tokens" in str(refused.value)


def test_what_fits_only_the_largest_worker_waits_for_it_and_is_not_refused():
    assert fits(200, 200, Fleet(256, 400)) == 200


def test_without_max_tokens_the_output_is_what_the_largest_cache_leaves():
    assert fits(100, None, Fleet(300)) == 200
    assert fits(100, None, Fleet()) == 412, "no worker known: the model's context decides, as before"


def test_the_context_length_still_binds_first():
    with pytest.raises(SubmissionError, match="context of 512"):
        fits(300, 300, Fleet(4096))


def test_a_fleet_that_does_not_know_the_kv_refuses_nothing_for_it():
    class Unknowing:
        def serves_soon(self, pool, revision):
            return True
    assert largest_kv(Unknowing(), topics.SHARED_POOL, REV) is None
    assert largest_kv(Fleet(300, 0), topics.SHARED_POOL, REV) is None, "a worker reporting none may hold it"
    assert largest_kv(Fleet(300, 500), topics.SHARED_POOL, REV) == 500
    assert largest_kv(None, topics.SHARED_POOL, REV) is None
