"""A worker lost with KV claims frees them once, at the settlement of its work: admission
holds the claim of each generation the silent worker ran until it settles as `worker_lost`,
then holds none of it, and the worker's late end, should it come, releases nothing more
(another tenant's claim on the survivor stays whole). With admission beside the workers
too, where the surviving admission claims again what the lost one ran, and frees it at the
settlement. Workers on a holding fake engine (`tests.e2e.test_worker_lost`); both logs."""
from __future__ import annotations

import time
import uuid

import pytest

from models import topics
from pipelines.admin import commands as admin
from pipelines.admission.capacity import key_of
from pipelines.eventlog import partition_for
from tests.e2e.test_worker_lost import REVISION, Fleet, comes_back_and_reports, lost_and_settled_once
from tests.conftest import make_log_opener
from tests.helpers import wait_until

KEY = key_of(None, REVISION)
CLAIM = 1 + 4  # what `Fleet.request` asks: one prompt token, four output tokens


@pytest.fixture(params=["embedded", "kafka"])
def fleet(request, tmp_path):
    made = Fleet(make_log_opener(request.param, tmp_path))
    yield made
    made.close()


def on_partition_of(worker, prefix: str) -> str:
    """A request id that the request id's hash places on a partition `worker` owns."""
    normal = topics.work_topic(None, "normal", REVISION)
    owned = wait_until(lambda: {p for t, p in (worker._assigned or ()) if t == normal.name}, 30,  # noqa: SLF001
                       what="the worker to own some of the work topic")
    return next(rid for rid in (f"{prefix}-{i}" for i in range(10_000))
                if partition_for(rid, normal.partitions) in owned)


def other_tenant(fleet: Fleet) -> str:
    tenant = "t" + uuid.uuid4().hex[:8]
    admin.create_tenant(fleet.view, tenant_id=tenant, name=tenant, actor="tests")
    return tenant


def test_a_lost_workers_claims_are_freed_once_at_the_settlement_of_its_work(fleet):
    admission = fleet.admission()
    claims = admission.claims
    doomed = fleet.node(admits=False)
    first = fleet.request("first")
    assert fleet.started_on(first) == doomed.worker.worker_id
    wait_until(lambda: claims.on_worker(doomed.worker.worker_id) == CLAIM, 30,
               what="admission to hold the running request's claim on its worker")
    survivor = fleet.node(admits=False)
    wait_until(lambda: survivor.worker._assigned and doomed.worker._assigned  # noqa: SLF001
               and not (survivor.worker._assigned & doomed.worker._assigned), 30,  # noqa: SLF001
               what="the two workers to split the work topic")
    steady = fleet.request(on_partition_of(survivor.worker, "steady"), tenant=other_tenant(fleet))
    assert fleet.started_on(steady) == survivor.worker.worker_id
    wait_until(lambda: claims.claims(KEY) == 2 * CLAIM, 30, what="both claims to be held")

    doomed.crash()
    crashed_at = time.monotonic()
    seen = []

    def settled() -> bool:
        seen.append(claims.claims(KEY))
        return "UsageSettled" in fleet.types(topics.LEDGER, first)
    wait_until(settled, 60, what="the lost worker's generation to settle")
    assert seen[0] == 2 * CLAIM, "the claim is held while the worker is silent, until it is judged lost"
    assert set(seen) <= {2 * CLAIM, CLAIM}, f"claims went elsewhere than down by one claim: {sorted(set(seen))}"
    lost_and_settled_once(fleet, first, crashed_at)
    assert claims.claims(KEY) == CLAIM and claims.on_worker(doomed.worker.worker_id) == 0
    assert claims.on_worker(survivor.worker.worker_id) == CLAIM

    # The tenant's next request runs on the survivor; the lost worker's late end of the first
    # (written before the next one's end) releases nothing: the other tenant's claim stays.
    second = fleet.request("second")
    assert fleet.decided(second) == "BudgetReserved"
    wait_until(lambda: claims.claims(KEY) == 2 * CLAIM, 30, what="the second request's claim")
    comes_back_and_reports(fleet, first, second)
    wait_until(lambda: claims.claims(KEY) == CLAIM, 30, what="the second request's claim to be released")
    assert claims.of(steady) is not None and claims.on_worker(survivor.worker.worker_id) == CLAIM


def test_with_admission_in_the_workers_the_survivor_claims_what_the_lost_one_ran_and_frees_it(fleet):
    doomed = fleet.node(admits=True)
    first = fleet.request("first")
    assert fleet.started_on(first) == doomed.worker.worker_id
    assert doomed.admission.claims.on_worker(doomed.worker.worker_id) == CLAIM, "taken at once, claimed there"
    survivor = fleet.node(admits=True)
    wait_until(lambda: survivor.admission.owned, 30, what="the second admission to own partitions")

    doomed.crash()
    crashed_at = time.monotonic()
    claims = survivor.admission.claims
    seen = []

    def settled() -> bool:
        seen.append(claims.claims(KEY))
        return "UsageSettled" in fleet.types(topics.LEDGER, first)
    wait_until(settled, 60, what="the lost worker's generation to settle")
    assert CLAIM in seen, "the survivor's admission claimed again what the lost worker ran"
    lost_and_settled_once(fleet, first, crashed_at)
    assert claims.claims(KEY) == 0 and claims.on_worker(doomed.worker.worker_id) == 0
