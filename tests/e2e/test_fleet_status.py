"""`GET /v1/admin/fleet` on the platform (both logs): an operator sees the platform's worker
with its revision and capacity, a second worker (a fake engine serving another revision)
as it joins, then as lost once its heartbeats stop, then as gone once it leaves. Tenants'
keys without the admin scope are refused."""
from __future__ import annotations

import uuid

from tests.fake_engine import FakeEngine
from tests.helpers import wait_until
from workers.engine_runner import EngineRunner


def fleet_worker(client, worker_id: str) -> dict | None:
    response = client.get("/v1/admin/fleet")
    assert response.status_code == 200, response.text
    return next((w for w in response.json()["workers"] if w["worker_id"] == worker_id), None)


def pool_of(client, revision: str, pool: str) -> dict | None:
    # Earlier tests may have left workers of the same revision in other pools: match both.
    return next((p for p in client.get("/v1/admin/fleet").json()["pools"]
                 if (p["pool"], p["model_revision"]) == (pool, revision)), None)


def test_the_fleet_needs_the_admin_scope(platform):
    _, tenant = platform.tenant()
    with platform.client(tenant) as client:
        denied = client.get("/v1/admin/fleet")
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "insufficient_scope"
    with platform.client() as anonymous:
        assert anonymous.get("/v1/admin/fleet").status_code == 401


def test_the_fleet_shows_each_worker_its_revision_capacity_and_state(platform):
    _, operator = platform.tenant(scopes=("admin",))
    engine = platform.runner.engine
    with platform.client(operator) as ops:
        ours = wait_until(lambda: (w := fleet_worker(ops, platform.worker.worker_id)) and w["status"] == "live" and w,
                          30, what="the platform's worker in the fleet")
        assert ours["model_revision"] == platform.model_revision
        assert ours["engine_config_hash"] == engine.engine_config_hash()
        assert ours["capacity"]["max_seqs"] == 8 and ours["capacity"]["max_model_len"] == engine.config.max_model_len
        assert ours["last_heartbeat_age_s"] < 5 and ours["load"]["free_slots"] <= 8
        assert ours["load"]["engine_slots_free"] + ours["load"]["take_ahead_free"] == ours["load"]["free_slots"]
        # The silence after which a worker is lost is the one admission judges by, never null.
        assert ops.get("/v1/admin/fleet").json()["lost_after_s"] == platform.settings.worker_lost_after_s
        assert ours["lost_after_s"] >= platform.settings.worker_lost_after_s
        ours_pool = wait_until(lambda: (p := pool_of(ops, platform.model_revision, ours["pool"]))
                               and p["workers"] >= 1 and p, 30, what="the pool summary to count the platform's worker")
        assert ours_pool["workers"] >= 1 and ours_pool["max_seqs"] >= 8

        revision = f"fake@{uuid.uuid4().hex[:8]}"
        runner = EngineRunner(FakeEngine(hold=False), name="fake-engine").start()
        loop = platform.start_worker(runner=runner, revision=revision, max_in_flight=3)
        try:
            second = wait_until(lambda: (w := fleet_worker(ops, loop.worker.worker_id)) and w["status"] == "live"
                                and w, 30, what="the second worker to join the fleet")
            assert (second["model_revision"], second["engine_config_hash"]) == (revision, "fake")
            assert second["capacity"]["max_seqs"] == 3
            theirs = pool_of(ops, revision, second["pool"])
            assert (theirs["workers"], theirs["max_seqs"]) == (1, 3)

            loop.worker.silence()  # its heartbeats stop, as a crash would leave it
            lost = wait_until(lambda: (w := fleet_worker(ops, loop.worker.worker_id))["status"] == "lost" and w,
                              15, what="the silent worker to be shown lost")
            assert lost["last_heartbeat_age_s"] > 1 and lost["left_at"] is None
            assert pool_of(ops, revision, second["pool"])["workers"] == 0
            assert pool_of(ops, revision, second["pool"])["by_status"]["lost"] == 1
            assert fleet_worker(ops, platform.worker.worker_id)["status"] == "live"
        finally:
            loop.halt()
            runner.close()
        # Its orderly close still says it left: an operator sees it gone, not lost.
        gone = wait_until(lambda: (w := fleet_worker(ops, loop.worker.worker_id))["status"] == "left" and w, 15,
                          what="the closed worker to be shown as left")
        assert gone["left_reason"] == "shutdown"
