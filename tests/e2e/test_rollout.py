"""A canary over HTTP, both logs: an operator starts a rollout of one alias to a second
revision (each served by a worker of known speed); callers naming a user are served by the
revision their arm says, stay on it, and raising the share moves some of them to the
candidate and none back; a rollback sends everyone to stable at once, and the routing
table the admin routes show is the one requests were routed by."""
from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

from models.rollout import ARM_CANDIDATE, stickiness_key
from tests.fleet_pool import pool_of

USERS = [f"user-{i}" for i in range(48)]


def test_a_canary_routes_each_user_stickily_steps_up_monotonically_and_rolls_back_at_once(platform):
    _, operator = platform.tenant(scopes=("admin",))
    tenant_id, secret = platform.tenant()
    with pool_of(platform, workers=1, pause_s=0.002, name="stable") as stable, \
            pool_of(platform, workers=1, pause_s=0.002, name="cand") as candidate, \
            platform.client(operator) as ops, platform.client(secret) as client, ThreadPoolExecutor(8) as pool:
        alias = stable.alias

        def served() -> dict[str, str]:
            """The revision that served one request of each user."""
            def one(user: str) -> tuple[str, str]:
                r = client.post("/v1/generations", json={"model_alias": alias, "input": "hi", "max_output_tokens": 2,
                                                         "ignore_eos": True, "stream": False, "user": user})
                assert r.status_code == 200 and r.json()["type"] == "completed", r.text
                return user, r.json()["model_revision"]
            return dict(pool.map(one, USERS))

        assert set(served().values()) == {stable.revision}
        started = ops.post("/v1/admin/rollouts", json={"alias": alias, "candidate_revision": candidate.revision,
                                                       "steps": [25, 75, 100], "step_duration_s": 600})
        assert started.status_code == 201, started.text
        assert ops.post("/v1/admin/rollouts", json={"alias": alias, "candidate_revision": candidate.revision}
                        ).status_code == 409, "one rollout per alias"
        table = platform.view.refresh().open_rollouts[alias]

        def expected() -> dict[str, str]:
            return {u: candidate.revision if table.arm_for(stickiness_key(tenant_id, "default", u)) == ARM_CANDIDATE
                    else stable.revision for u in USERS}
        at_25 = served()
        assert at_25 == expected() and served() == at_25, "each user on its arm, and staying there"
        assert stable.revision in at_25.values() and candidate.revision in at_25.values(), at_25

        stepped = ops.post(f"/v1/admin/rollouts/{alias}/step")
        assert stepped.status_code == 200 and stepped.json()["weight_percent"] == 75.0, stepped.text
        at_75 = served()
        assert at_75 == expected()
        assert all(at_75[u] == candidate.revision for u, r in at_25.items() if r == candidate.revision), "none back"
        assert sum(r == candidate.revision for r in at_75.values()) > sum(r == candidate.revision
                                                                          for r in at_25.values())

        back = ops.post(f"/v1/admin/rollouts/{alias}/rollback", json={"reason": "operator saw errors"})
        assert back.status_code == 200 and back.json()["status"] == "rolled back", back.text
        assert set(served().values()) == {stable.revision}, "no new request reaches the candidate"
        shown = ops.get("/v1/admin/rollouts", params={"alias": alias, "ended": True}).json()["data"]
        assert [h["event"] for h in shown[0]["history"]] == ["started", "stepped", "rolled_back"]
        assert ops.get(f"/v1/admin/rollouts/{alias}").status_code == 404, "none open"
        assert ops.post(f"/v1/admin/revisions/{stable.revision}/drain").status_code == 409, \
            "the alias would have nowhere to go"
        assert ops.post(f"/v1/admin/rollouts/{alias}-{uuid.uuid4().hex[:4]}/promote").status_code == 404
