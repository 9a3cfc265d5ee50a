"""Work spreads by request, not by tenant: one tenant flooding a pool of three workers of one
revision is served by all three, and when one of them crashes the two survivors absorb its
share; every request ends exactly once and settles exactly once. Engines of known speed
(`tests.slow_engine`) serve a revision of their own; both logs."""
from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timezone
from concurrent.futures import ThreadPoolExecutor

import pytest

from models import topics
from models.events import decode
from pipelines import admin
from pipelines.eventlog import partition_for
from tests.e2e.test_worker_crash import SeverableLog
from tests.helpers import wait_until
from tests.slow_engine import SlowEngine
from workers.engine_runner import EngineRunner

TOKENS = 10  # a request takes 0.3 s on an engine of 0.03 s a token
FIRST, SECOND = 30, 60  # requests before the crash and around it


@pytest.fixture
def pool_of_three(platform):
    """A revision of its own under a new alias, served by three workers, each its own engine
    of known speed, the first on a log handle that can be cut (as a crash cuts it):
    (alias, revision, loops, cut)."""
    tag = uuid.uuid4().hex[:8]
    alias, revision = f"spread-{tag}", f"spread@{tag}"
    admin.approve_model(platform.view, alias=alias, model_revision=revision,
                        model_path=str(platform.runner.engine.config.model), engine_config_hash="slow-engine",
                        max_model_len=512, actor="tests", price_input_per_1k_micros=1000,
                        price_output_per_1k_micros=9000)
    runners = [EngineRunner(SlowEngine(0.03), name=f"slow-{i}").start() for i in range(3)]
    doomed_log = SeverableLog(platform.open_log())
    platform.logs.append(doomed_log._inner)
    loops = []

    def crash() -> None:
        # Loop stopped (and its heartbeats with it): what the process would write from now on
        # never reaches the log, its engine's work vanishes, its group membership ends.
        doomed_log.severed = True
        runners[0].close()
        loops[0].worker._consumer.close()
        loops[0].worker._cancels.stop()

    loops.append(platform.start_worker(runner=runners[0], revision=revision, max_in_flight=2, log=doomed_log,
                                       close=crash))
    loops += [platform.start_worker(runner=runner, revision=revision, max_in_flight=2) for runner in runners[1:]]
    try:
        yield alias, revision, loops
    finally:
        for loop in loops:
            loop.halt()
        for runner in runners:
            runner.close()


def outcomes_by_request(platform, request_ids: set[str]) -> dict[str, list]:
    found: dict[str, list] = {r: [] for r in request_ids}
    for record in platform.admin_log.read_topic(topics.OUTCOMES.name):
        env = decode(record.value)
        if env.correlation_id in found:
            found[env.correlation_id].append(env)
    return found


def settled(platform, request_ids: set[str]) -> Counter:
    count: Counter = Counter()
    for record in platform.admin_log.read_topic(topics.LEDGER.name):
        env = decode(record.value)
        if env.correlation_id in request_ids and env.event_type == "UsageSettled":
            count[env.correlation_id] += 1
    return count


def requests_of(platform, tenant_id: str) -> set[str]:
    return {env.correlation_id for env in map(decode_record, platform.admin_log.read_topic(topics.REQUESTS.name))
            if env.tenant_id == tenant_id and env.event_type == "GenerationRequested"}


def decode_record(record):
    return decode(record.value)


def started_at(platform, request_ids: set[str]) -> dict:
    return {r: e.occurred_at for r, events in outcomes_by_request(platform, request_ids).items()
            for e in events if e.event_type == "GenerationStarted"}


def starts_by_worker(platform, request_ids: set[str]) -> dict[str, str]:
    """The worker that started each request (of those started)."""
    return {r: e.payload.worker_id for r, events in outcomes_by_request(platform, request_ids).items()
            for e in events if e.event_type == "GenerationStarted"}


def test_one_tenants_flood_uses_every_worker_and_survivors_absorb_a_crashed_ones_share(platform, pool_of_three):
    alias, revision, loops = pool_of_three
    doomed, survivors = loops[0], loops[1:]
    ids = [loop.worker.worker_id for loop in loops]
    tenant_id, secret = platform.tenant()
    body = {"model_alias": alias, "input": "flood", "max_output_tokens": TOKENS, "ignore_eos": True, "stream": False}

    with platform.client(secret) as client, ThreadPoolExecutor(12) as pool:
        wait_until(lambda: client.get(f"/v1/models/{alias}").json()["serving"]["workers"] >= 3, 30,
                   what="the fleet to show the three workers")
        normal = topics.work_topic(None, "normal", revision)

        def split_between_all() -> bool:
            mine = [{p for t, p in (loop.worker._assigned or set()) if t == normal.name} for loop in loops]
            return all(mine) and sum(map(len, mine)) == normal.partitions
        wait_until(split_between_all, 60, what="the three workers to split the work topic")

        def send(_=None):
            with platform.client(secret) as own:
                return own.post("/v1/generations", json=body)

        answers = list(pool.map(send, range(FIRST)))
        assert all(a.status_code == 200 and a.json()["type"] == "completed" for a in answers), \
            [a.text for a in answers if a.status_code != 200][:3]
        first = [a.json()["id"] for a in answers]
        by_worker = Counter(starts_by_worker(platform, set(first)).values())
        assert all(by_worker[w] > 0 for w in ids), f"not every worker served the tenant: {by_worker}"

        pending = [pool.submit(send) for _ in range(SECOND)]
        # The crash comes mid-flood, with the doomed worker running some of the second wave
        # (the first is over).
        wait_until(lambda: doomed.worker.in_flight > 0, 60, what="the doomed worker to run work of the second wave")
        doomed.halt()
        crashed_at = datetime.now(timezone.utc)
        answers = [f.result(timeout=120) for f in pending]
    second = requests_of(platform, tenant_id) - set(first)
    assert len(second) == SECOND


    def end_of(answer) -> str:
        return answer.json()["type"] if answer.status_code == 200 else answer.json()["error"]["code"]
    # Only what ran on the crashed worker (two slots) is lost; a client of it is told so.
    ends = Counter(map(end_of, answers))
    assert set(ends) <= {"completed", "worker_lost"} and ends["worker_lost"] <= 2, ends

    everyone = set(first) | set(second)
    # Every request ends exactly once, and settles exactly once.
    wait_until(lambda: set(settled(platform, everyone)) == everyone, 30, what="every request to settle")
    terminals = {r: [e.event_type for e in events if e.event_type != "GenerationStarted"]
                 for r, events in outcomes_by_request(platform, everyone).items()}
    assert all(len(t) == 1 for t in terminals.values()), {r: t for r, t in terminals.items() if len(t) != 1}
    assert set(settled(platform, everyone).values()) == {1}
    starts = Counter(r for r, events in outcomes_by_request(platform, everyone).items()
                     for e in events if e.event_type == "GenerationStarted")
    assert set(starts.values()) == {1}, "a request was started twice"

    # The survivors took everything started after the crash, each a fair part of it,
    # including work from the partitions the crashed worker owned.
    started = starts_by_worker(platform, set(second))
    before = {r for r, at in started_at(platform, set(second)).items() if at <= crashed_at}
    after = {r: w for r, w in started.items() if r not in before}
    split = Counter(after.values())
    assert doomed.worker.worker_id not in split, split
    assert all(split[s.worker.worker_id] >= len(after) // 4 for s in survivors), split
    owned = {p for t, p in doomed.worker._assigned if t == normal.name}
    orphaned = [r for r in after if partition_for(r, normal.partitions) in owned]
    assert orphaned, "no work of the crashed worker's partitions was left to take over"
