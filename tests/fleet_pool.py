"""A pool of workers on engines of known speed (`tests.slow_engine`) serving a revision of
its own, the first of which can be crashed as a process dies; and what the log says of the
requests they served (starts, ends, settlements), for the e2e tests of spreading, capacity
and shedding (`tests/e2e/test_spread.py`, `test_capacity_admission.py`, `test_shed_on_failover.py`)."""
from __future__ import annotations

import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from models import topics
from models.events import decode
from pipelines.admin import commands as admin
from pipelines.admission.capacity import key_of
from tests.e2e.test_worker_crash import SeverableLog
from tests.harness import Loop
from tests.helpers import wait_until
from tests.slow_engine import SlowEngine
from workers.engine_runner import EngineRunner


@dataclass
class Pool:
    alias: str
    revision: str
    loops: list[Loop]  # loops[0] is the one that can crash: `loops[0].halt()` crashes it

    def wait_split(self, priority: str = "normal", timeout_s: float = 60.0) -> None:
        """Until every worker owns some of the revision's work partitions, and they own them all."""
        topic = topics.work_topic(None, priority, self.revision)

        def split_between_all() -> bool:
            mine = [{p for t, p in (loop.worker._assigned or set()) if t == topic.name} for loop in self.loops]
            return all(mine) and sum(map(len, mine)) == topic.partitions
        wait_until(split_between_all, timeout_s, what=f"the {len(self.loops)} workers to split the work topic")


@contextmanager
def pool_of(platform, *, workers: int = 3, pause_s: float, max_in_flight: int = 2, name: str = "pool",
            price_output_per_1k_micros: int = 9000) -> Iterator[Pool]:
    """A revision of its own under a new alias, served by `workers` workers, each its own
    engine of one token per `pause_s`, the first on a log handle that can be cut. Halting
    the first loop crashes it: what it would write from then on never reaches the log, its
    engine's work vanishes, its group membership ends and its heartbeats stop."""
    tag = uuid.uuid4().hex[:8]
    alias, revision = f"{name}-{tag}", f"{name}@{tag}"
    admin.approve_model(platform.view, alias=alias, model_revision=revision,
                        model_path=str(platform.runner.engine.config.model), engine_config_hash="slow-engine",
                        max_model_len=512, actor="tests", price_input_per_1k_micros=1000,
                        price_output_per_1k_micros=price_output_per_1k_micros)
    runners = [EngineRunner(SlowEngine(pause_s), name=f"{name}-{i}").start() for i in range(workers)]
    doomed_log = SeverableLog(platform.open_log())
    loops: list[Loop] = []

    def crash() -> None:
        doomed_log.severed = True
        runners[0].close()
        loops[0].worker._consumer.close()
        loops[0].worker._cancels.stop()

    try:
        loops.append(platform.start_worker(runner=runners[0], revision=revision, max_in_flight=max_in_flight,
                                           log=doomed_log, close=crash))
        loops += [platform.start_worker(runner=runner, revision=revision, max_in_flight=max_in_flight)
                  for runner in runners[1:]]
        yield Pool(alias, revision, loops)
    finally:
        for loop in loops:
            loop.halt()
        for runner in runners:
            runner.close()
        doomed_log._inner.close()  # after its loop: a crash leaves it to the end of the pool


def warm_up(platform, secret: str, alias: str, revision: str, payload: dict, *, workers: int = 1) -> None:
    """Until the fleet shows `workers` workers of the revision and admission has measured its
    pace from one request served (`payload`), so decisions rest on measured service rather
    than the heartbeats' first readings."""
    with platform.client(secret) as client:
        wait_until(lambda: client.get(f"/v1/models/{alias}").json()["serving"]["workers"] >= workers, 30,
                   what=f"the fleet to show {workers} workers of {revision}")
        served = client.post("/v1/generations", json=payload)
        assert served.status_code == 200, served.text
    rates = platform.admission.capacity.rates_of(key_of(None, revision))
    wait_until(lambda: rates.service_ms is not None and rates.tpot_ms is not None, 30,
               what="admission to measure the revision's service")


def decode_record(record):
    return decode(record.value)


def of_tenant(platform, topic_name: str, tenant_id: str) -> list:
    return [env for env in map(decode_record, platform.admin_log.read_topic(topic_name)) if env.tenant_id == tenant_id]


def requests_of(platform, tenant_id: str) -> set[str]:
    return {env.correlation_id for env in of_tenant(platform, topics.REQUESTS.name, tenant_id)
            if env.event_type == "GenerationRequested"}


def outcomes_by_request(platform, request_ids: set[str]) -> dict[str, list]:
    found: dict[str, list] = {r: [] for r in request_ids}
    for env in map(decode_record, platform.admin_log.read_topic(topics.OUTCOMES.name)):
        if env.correlation_id in found:
            found[env.correlation_id].append(env)
    return found


def settled(platform, request_ids: set[str]) -> Counter:
    count: Counter = Counter()
    for env in map(decode_record, platform.admin_log.read_topic(topics.LEDGER.name)):
        if env.correlation_id in request_ids and env.event_type == "UsageSettled":
            count[env.correlation_id] += 1
    return count


def started_at(platform, request_ids: set[str]) -> dict:
    return {r: e.occurred_at for r, events in outcomes_by_request(platform, request_ids).items()
            for e in events if e.event_type == "GenerationStarted"}


def starts_by_worker(platform, request_ids: set[str]) -> dict[str, str]:
    """The worker that started each request (of those started)."""
    return {r: e.payload.worker_id for r, events in outcomes_by_request(platform, request_ids).items()
            for e in events if e.event_type == "GenerationStarted"}


def assert_ended_and_settled_once(platform, request_ids: set[str], timeout_s: float = 60.0) -> None:
    """Every request settles, then: each was started exactly once, ended exactly once and
    settled exactly once."""
    wait_until(lambda: set(settled(platform, request_ids)) == request_ids, timeout_s,
               what="every request to settle")
    outcomes = outcomes_by_request(platform, request_ids)
    terminals = {r: [e.event_type for e in events if e.event_type != "GenerationStarted"]
                 for r, events in outcomes.items()}
    assert all(len(t) == 1 for t in terminals.values()), {r: t for r, t in terminals.items() if len(t) != 1}
    assert set(settled(platform, request_ids).values()) == {1}
    starts = Counter(r for r, events in outcomes.items() for e in events if e.event_type == "GenerationStarted")
    assert {r: starts[r] for r in request_ids if starts[r] != 1} == {}, "a request was not started exactly once"


def ledger_kinds(platform, tenant_id: str) -> dict[str, list[str]]:
    kinds: dict[str, list[str]] = {}
    for env in of_tenant(platform, topics.LEDGER.name, tenant_id):
        kinds.setdefault(env.correlation_id, []).append(env.event_type)
    return kinds


def assert_settled_once(platform, tenant_id: str, admitted: list[str]) -> None:
    """Each admitted request of the tenant settled exactly once and released its reservation once."""
    kinds = wait_until(lambda: (k := ledger_kinds(platform, tenant_id))
                       and all(k.get(r, []).count("UsageSettled") for r in admitted) and k, 60,
                       what="every admitted request to settle")
    for request_id in admitted:
        assert kinds[request_id].count("UsageSettled") == 1, (request_id, kinds[request_id])
        assert kinds[request_id].count("ReservationReleased") == 1, (request_id, kinds[request_id])
