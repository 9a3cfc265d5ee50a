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
# The slow candidate's pause at each token: the guardrail's ratio of 1.5 is passed while a
# loaded machine adds less than about 0.4 s to each of stable's figures.
SLOW_PAUSE_S = 0.2


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
        def expected() -> dict[str, str]:
            """Each user's revision as the routing table has it now."""
            table = platform.view.refresh().open_rollouts[alias]
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


def test_a_slow_candidate_is_rolled_back_by_its_guardrails_and_thin_traffic_pauses_inconclusive(platform):
    from pipelines.admin.commands import RegistryView
    from pipelines.rollouts.controller import RolloutController
    from tests.harness import Loop
    from tests.helpers import wait_until

    _, operator = platform.tenant(scopes=("admin",))
    _, secret = platform.tenant()
    log = platform.open_log()
    view = RegistryView(log)
    controller = RolloutController(log, view, every_s=0.2)
    loop = Loop("rollouts", lambda: controller.run_once(0.05), controller.close).start()
    min_samples = 10
    try:
        with pool_of(platform, workers=1, pause_s=0.002, name="stable") as stable, \
                pool_of(platform, workers=1, pause_s=SLOW_PAUSE_S, name="slow") as slow, \
                platform.client(operator) as ops, platform.client(secret) as client, ThreadPoolExecutor(4) as pool:
            alias = stable.alias

            def send(user: str) -> str:
                r = client.post("/v1/generations", json={"model_alias": alias, "input": "hi", "max_output_tokens": 5,
                                                         "ignore_eos": True, "stream": False, "user": user})
                assert r.status_code == 200 and r.json()["type"] == "completed", r.text
                return r.json()["model_revision"]

            started = ops.post("/v1/admin/rollouts", json={
                "alias": alias, "candidate_revision": slow.revision, "steps": [50, 100], "step_duration_s": 600,
                "guardrails": {"min_samples": min_samples}})
            assert started.status_code == 201, started.text
            rollout_id = started.json()["rollout_id"]
            served: list[str] = []
            for batch in range(12):  # until the guardrail acts; 48 users' requests at most
                served += pool.map(send, [f"u-{batch}-{i}" for i in range(4)])
                if view.refresh().rollouts[rollout_id].outcome != "open":
                    break
            ended = wait_until(lambda: (r := view.refresh().rollouts[rollout_id]).outcome != "open" and r, 30,
                               what="the guardrail to act")
            assert ended.outcome == "rolled_back", ended.history
            last = ended.history[-1]
            # Slow at every token, the first included: either latency figure is a breach.
            assert last["reason"] == "guardrail" and last["threshold"] == 1.5, last
            assert last["figure"] in ("ttft_p95_ratio", "tpot_p95_ratio"), last
            assert last["actor"] == "rollout-analysis" and last["value"] > 1.5
            # Judged once both arms had `min_samples`; beyond them, only what was sent while the
            # verdict was reached and read (a few batches of 4, half of them the candidate's).
            on_candidate = served.count(slow.revision)
            assert min_samples <= on_candidate <= min_samples + 12, (on_candidate, len(served))
            assert set(pool.map(send, [f"after-{i}" for i in range(16)])) == {stable.revision}

            thin = ops.post("/v1/admin/rollouts", json={
                "alias": alias, "candidate_revision": slow.revision, "steps": [50, 100], "step_duration_s": 2,
                "guardrails": {"min_samples": 50}})
            assert thin.status_code == 201, thin.text
            list(pool.map(send, [f"thin-{i}" for i in range(6)]))
            paused = wait_until(lambda: (r := view.refresh().open_rollouts.get(alias)) and r.paused and r, 30,
                                what="the thin step to pause")
            assert paused.paused == "inconclusive" and paused.weight_percent == 50.0 and paused.step == 0
            assert ops.get(f"/v1/admin/rollouts/{alias}").json()["status"] == "paused: inconclusive"
            # Another build of the candidate: the rollout goes on with it from its first step.
            fixed = f"{slow.revision}-fixed-{uuid.uuid4().hex[:4]}"
            approved = ops.post("/v1/admin/models", json={
                "alias": f"fixed-{uuid.uuid4().hex[:6]}", "model_revision": fixed, "model_path": "/nowhere",
                "engine_config_hash": fixed, "max_model_len": 64})
            assert approved.status_code == 201, approved.text
            replaced = ops.post(f"/v1/admin/rollouts/{alias}/candidate", json={"candidate_revision": fixed})
            assert replaced.status_code == 200, replaced.text
            assert (replaced.json()["candidate_revision"], replaced.json()["status"], replaced.json()["step"]) == \
                (fixed, "progressing", 0) and replaced.json()["history"][-1]["event"] == "candidate_replaced"
            assert ops.post(f"/v1/admin/rollouts/{alias}/rollback").status_code == 200

            # Quality from the eval table: a candidate scoring too far below stable on a task
            # is rolled back without a request sent.
            table = {"source": "nightly", "rows": [
                {"task": "summarize", "model_revision": stable.revision, "score": 0.82, "samples": 200},
                {"task": "summarize", "model_revision": slow.revision, "score": 0.71, "samples": 200}]}
            assert ops.post("/v1/admin/evals", json=table).status_code == 201
            assert ops.post("/v1/admin/evals", json={"source": "x", "rows": [
                {"task": "t", "model_revision": "never-approved", "score": 0.5}]}).status_code == 404
            assert len(ops.get("/v1/admin/evals", params={"task": "summarize"}).json()["data"]) == 2
            gated = ops.post("/v1/admin/rollouts", json={
                "alias": alias, "candidate_revision": slow.revision, "steps": [50, 100], "step_duration_s": 600,
                "guardrails": {"min_samples": 50, "max_eval_score_drop": 0.05}})
            assert gated.status_code == 201, gated.text
            gated_id = gated.json()["rollout_id"]
            ended = wait_until(lambda: (r := view.refresh().rollouts[gated_id]).outcome != "open" and r, 30,
                               what="the eval guardrail to act")
            assert ended.outcome == "rolled_back" and ended.history[-1]["figure"] == "eval_score_drop", ended.history
            assert ended.history[-1]["threshold"] == 0.05 and abs(ended.history[-1]["value"] - 0.11) < 1e-9
    finally:
        loop.halt()
        view.close()
        log.close()
        assert loop.error is None, loop.error


def test_a_shadow_rollout_answers_from_stable_and_bills_the_copies_to_the_platform(platform):
    from models import topics
    from models.rollout import SHADOW_TENANT
    from pipelines.admin.commands import RegistryView
    from pipelines.rollouts.controller import RolloutController
    from pipelines.cache.similarity import Embedder, model_dir
    from tests.fleet_pool import ledger_kinds, of_tenant, outcomes_by_request
    from tests.helpers import wait_until

    log = platform.open_log()
    view = RegistryView(log)
    try:
        _, operator = platform.tenant(scopes=("admin",))
        tenant_id, secret = platform.tenant()
        with pool_of(platform, workers=1, pause_s=0.002, name="stable") as stable, \
                pool_of(platform, workers=1, pause_s=0.002, max_in_flight=8, name="shadow") as shadow, \
                platform.client(operator) as ops, platform.client(secret) as client:
            started = ops.post("/v1/admin/rollouts", json={"alias": stable.alias, "candidate_revision": shadow.revision,
                                                           "mode": "shadow", "steps": [100]})
            assert started.status_code == 201, started.text
            answers = []
            for i in range(12):  # one at a time: the candidate has free slots for every copy
                r = client.post("/v1/generations", json={"model_alias": stable.alias, "input": "hi",
                                                         "max_output_tokens": 3, "ignore_eos": True, "stream": False,
                                                         "user": f"s-{i}"})
                assert r.status_code == 200 and r.json()["type"] == "completed", r.text
                answers.append(r.json())
            assert {a["model_revision"] for a in answers} == {stable.revision}, "clients only ever see stable"
            ids = {a["id"] for a in answers}
            copies = {f"{rid}.shadow" for rid in ids}
            ends = wait_until(lambda: (o := outcomes_by_request(platform, copies)) and all(
                any(e.event_type == "GenerationCompleted" for e in es) for es in o.values()) and o, 60,
                what="the shadow copies to end")
            assert {e.payload.model_revision for es in ends.values() for e in es
                    if e.event_type == "GenerationCompleted"} == {shadow.revision}
            kinds = wait_until(lambda: (k := ledger_kinds(platform, tenant_id)) and all(
                "UsageSettled" in k.get(rid, []) for rid in ids) and k, 60, what="the tenant's requests settled")
            assert set(kinds) == ids, "the tenant's ledger holds its own requests only"
            platform_account = wait_until(lambda: (k := ledger_kinds(platform, SHADOW_TENANT)) and all(
                "UsageSettled" in k.get(c, []) for c in copies) and k, 60, what="the copies settled")
            assert copies <= set(platform_account)

            # The guardrails compare each pair: the same engine, so the same text.
            controller = RolloutController(log, view, every_s=0.2, embedder=Embedder(model_dir(platform.settings.home)))
            try:
                compared = wait_until(lambda: (controller.run_once(0.05), len(controller.compared) >= len(ids))[1]
                                      and controller.compared, 60, what="every shadow pair compared")
            finally:
                controller.close()
            assert {c.shadow_request_id for c in compared} == copies and {c.similarity for c in compared} == {1.0}
            assert all(c.stable_output_tokens == c.candidate_output_tokens == 3 for c in compared)
            on_log = {env.correlation_id for env in of_tenant(platform, topics.OUTCOMES.name, SHADOW_TENANT)
                      if env.event_type == "ShadowCompared"}
            assert on_log == copies
            assert ops.post(f"/v1/admin/rollouts/{stable.alias}/rollback").status_code == 200
    finally:
        view.close()
        log.close()
