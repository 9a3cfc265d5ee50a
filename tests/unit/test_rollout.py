"""Rollouts in the registry: sticky, monotone assignment by traffic share, the routing
table each rollout event leaves, drain, the admin commands' refusals, and a replay of the
same events giving the same routes and history."""
from __future__ import annotations

import math
from datetime import timedelta

import pytest

from models.events import new_event
from models.events_admin import ModelRevisionApproved, ModelRevisionRetired
from models.events_rollout import (
    RevisionDrained, RolloutPaused, RolloutPromoted, RolloutResumed, RolloutRolledBack, RolloutStarted, RolloutStepped,
)
from models.registry import Registry
from models.rollout import ARM_CANDIDATE, ARM_STABLE, stickiness_key
from pipelines.admin import commands as admin
from pipelines.rollouts import commands as rollouts
from pipelines.admin.commands import AdminConflict, AdminError, AdminNotFound, RegistryView
from pipelines.bootstrap import topic_specs
from pipelines.eventlog.embedded import EmbeddedEventLog
from tests.unit.test_admission import REV, T0, registry

CANDIDATE = "tiny@new"
KEYS = [stickiness_key("acme", f"app-{i}") for i in range(2000)]


def apply(reg: Registry, *payloads, at=T0) -> Registry:
    for i, payload in enumerate(payloads):
        reg.apply(new_event(payload, tenant_id="_platform", correlation_id="admin", occurred_at=at + timedelta(seconds=i)))
    return reg


def with_candidate() -> Registry:
    return apply(registry(), ModelRevisionApproved(model_revision=CANDIDATE, model_path="/n", engine_config_hash="new",
                                                   max_model_len=512, actor="ops"))


def started(weight: float = 25.0, mode: str = "canary") -> RolloutStarted:
    return RolloutStarted(rollout_id="ro_1", alias="tiny", stable_revision=REV, candidate_revision=CANDIDATE, mode=mode,
                          steps=tuple(sorted({weight, 50.0, 100.0})), step_duration_s=60, actor="ops")


def arms(reg: Registry) -> dict[str, str]:
    return {key: reg.route("tiny", "acme", key).arm for key in KEYS}


def test_a_canary_s_share_is_within_binomial_noise_sticky_and_raising_it_only_moves_keys_to_the_candidate():
    reg = apply(with_candidate(), started(25.0))
    at_25 = arms(reg)
    share = sum(a == ARM_CANDIDATE for a in at_25.values()) / len(KEYS)
    assert abs(share - 0.25) <= 3 * math.sqrt(0.25 * 0.75 / len(KEYS)), share
    assert arms(reg) == at_25, "the same key, the same arm, while the share holds"
    for key, arm in at_25.items():
        assert reg.route("tiny", "acme", key).model_revision == (CANDIDATE if arm == ARM_CANDIDATE else REV)
    apply(reg, RolloutStepped(rollout_id="ro_1", step=1, weight_percent=50.0, actor="ops"))
    at_50 = arms(reg)
    assert all(at_50[k] == ARM_CANDIDATE for k, a in at_25.items() if a == ARM_CANDIDATE), "no key went back"
    moved = sum(at_25[k] == ARM_STABLE and at_50[k] == ARM_CANDIDATE for k in KEYS) / len(KEYS)
    assert abs(moved - 0.25) <= 3 * math.sqrt(0.25 * 0.75 / len(KEYS)), moved
    assert reg.route("tiny", "acme").arm is None and reg.resolve_alias("tiny", "acme").model_revision == REV, \
        "without a key (a tokenizer warm-up, a listing): the alias's own revision"


def test_a_user_named_by_the_caller_is_its_own_key():
    assert stickiness_key("acme", "app", "u-1") != stickiness_key("acme", "app", "u-2")
    assert stickiness_key("acme", "app") == stickiness_key("acme", "app", None)
    assert stickiness_key("acme", "app", "u-1") != stickiness_key("other", "app", "u-1")


def test_pause_holds_the_share_promote_moves_the_alias_rollback_ends_the_candidate_s_traffic():
    reg = apply(with_candidate(), started(25.0))
    before = arms(reg)
    apply(reg, RolloutPaused(rollout_id="ro_1", reason="inconclusive", detail="12 of 50 samples", actor="analysis"))
    assert arms(reg) == before and reg.rollouts["ro_1"].status() == "paused: inconclusive"
    apply(reg, RolloutResumed(rollout_id="ro_1", actor="ops"))
    assert reg.rollouts["ro_1"].status() == "progressing"
    apply(reg, RolloutPromoted(rollout_id="ro_1", actor="ops"))
    assert reg.aliases["tiny"].model_revision == CANDIDATE and "tiny" not in reg.open_rollouts
    assert set(arms(reg).values()) == {None} and reg.resolve_alias("tiny", "acme", KEYS[0]).model_revision == CANDIDATE
    assert reg.rollouts["ro_1"].status() == "promoted"
    assert [h["event"] for h in reg.rollouts["ro_1"].history] == ["started", "paused", "resumed", "promoted"]

    back = apply(with_candidate(), started(50.0))
    apply(back, RolloutRolledBack(rollout_id="ro_1", reason="breach", figure="ttft_p95_ratio", value=2.4,
                                  threshold=1.5, actor="analysis"))
    assert {back.route("tiny", "acme", k).model_revision for k in KEYS} == {REV}
    assert back.aliases["tiny"].model_revision == REV and back.rollouts["ro_1"].status() == "rolled back"
    assert back.rollouts["ro_1"].history[-1]["figure"] == "ttft_p95_ratio"
    apply(back, RolloutStepped(rollout_id="ro_1", step=1, weight_percent=50.0, actor="ops"))
    assert "tiny" not in back.open_rollouts, "an ended rollout takes no more steps"


def test_a_retired_candidate_gets_no_traffic_and_shadow_serves_everyone_from_stable():
    reg = apply(with_candidate(), started(50.0), ModelRevisionRetired(model_revision=CANDIDATE, actor="ops"))
    assert {reg.route("tiny", "acme", k).model_revision for k in KEYS} == {REV}
    shadow = apply(with_candidate(), started(50.0, mode="shadow"))
    assert {shadow.route("tiny", "acme", k).model_revision for k in KEYS} == {REV}
    mirrored = sum(shadow.open_rollouts["tiny"].mirrors(k) for k in KEYS) / len(KEYS)
    assert abs(mirrored - 0.5) <= 3 * math.sqrt(0.25 / len(KEYS))


def test_draining_a_candidate_rolls_back_and_draining_a_stable_promotes():
    reg = apply(with_candidate(), started(25.0), RevisionDrained(model_revision=CANDIDATE, actor="ops"))
    assert reg.aliases["tiny"].model_revision == REV and reg.rollouts["ro_1"].status() == "rolled back"
    reg = apply(with_candidate(), started(25.0), RevisionDrained(model_revision=REV, actor="ops"))
    assert reg.aliases["tiny"].model_revision == CANDIDATE and reg.rollouts["ro_1"].status() == "promoted"


def test_a_replay_of_the_same_events_gives_the_same_routes_and_history():
    events = [started(25.0), RolloutStepped(rollout_id="ro_1", step=1, weight_percent=50.0, actor="ops"),
              RolloutPaused(rollout_id="ro_1", actor="ops")]
    one, two = apply(with_candidate(), *events), apply(with_candidate(), *events)
    assert arms(one) == arms(two)
    assert one.rollouts["ro_1"].history == two.rollouts["ro_1"].history


def test_steps_must_rise_within_0_and_100_and_the_candidate_differ():
    for bad in ((25.0, 5.0), (0.0, 50.0), (50.0, 150.0), ()):
        with pytest.raises(ValueError):
            RolloutStarted(rollout_id="r", alias="a", stable_revision=REV, candidate_revision=CANDIDATE, steps=bad,
                           step_duration_s=1, actor="ops")
    with pytest.raises(ValueError):
        RolloutStarted(rollout_id="r", alias="a", stable_revision=REV, candidate_revision=REV, steps=(5.0,),
                       step_duration_s=1, actor="ops")


@pytest.fixture
def view(tmp_path):
    log = EmbeddedEventLog(tmp_path / "log.db")
    log.ensure_topics(topic_specs())
    v = RegistryView(log)
    admin.create_tenant(v, tenant_id="acme", name="Acme", actor="ops")
    for revision in (REV, CANDIDATE):
        admin.approve_model(v, alias="tiny", model_revision=revision, model_path="/m", engine_config_hash=revision,
                            max_model_len=512, actor="ops")
    admin.set_alias(v, alias="tiny", model_revision=REV, actor="ops")
    yield v
    v.close()
    log.close()


def test_the_commands_write_what_the_registry_routes_by_and_refuse_what_makes_no_sense(view):
    with pytest.raises(AdminNotFound):
        rollouts.start(view, alias="nope", candidate_revision=CANDIDATE, actor="ops")
    with pytest.raises(AdminNotFound):
        rollouts.start(view, alias="tiny", candidate_revision="never@approved", actor="ops")
    with pytest.raises(AdminError):
        rollouts.start(view, alias="tiny", candidate_revision=CANDIDATE, actor="ops", steps=(50.0, 10.0))
    with pytest.raises(AdminNotFound):
        rollouts.step(view, alias="tiny", actor="ops")
    rollouts.start(view, alias="tiny", candidate_revision=CANDIDATE, actor="ops", steps=(10.0, 100.0),
                   rollout_id="ro_cmd")
    with pytest.raises(AdminConflict):
        rollouts.start(view, alias="tiny", candidate_revision=CANDIDATE, actor="ops")
    with pytest.raises(AdminConflict):
        admin.set_alias(view, alias="tiny", model_revision=CANDIDATE, actor="ops")
    with pytest.raises(AdminConflict):
        rollouts.resume(view, alias="tiny", actor="ops")
    rollouts.pause(view, alias="tiny", actor="ops")
    rollouts.step(view, alias="tiny", actor="ops")
    state = view.refresh().open_rollouts["tiny"]
    assert (state.weight_percent, state.paused) == (100.0, None), "a step ends a pause"
    with pytest.raises(AdminConflict):
        rollouts.step(view, alias="tiny", actor="ops")
    rollouts.rollback(view, alias="tiny", actor="ops", reason="manual")
    registry = view.refresh()
    assert registry.aliases["tiny"].model_revision == REV and "tiny" not in registry.open_rollouts
    described = rollouts.describe(registry.rollouts["ro_cmd"])
    assert described["status"] == "rolled back" and [h["event"] for h in described["history"]] == \
        ["started", "paused", "stepped", "rolled_back"]
    with pytest.raises(AdminConflict):  # the alias points at it with nowhere else to go
        rollouts.drain(view, model_revision=REV, actor="ops")


class Counting:
    def count(self, model_path, text):
        return 3


class Serving:
    def __init__(self, revisions):
        self.revisions = revisions

    def serves_soon(self, pool, revision):
        return revision in self.revisions


def test_a_submission_pins_the_arm_its_caller_is_on_and_stays_off_a_candidate_nobody_serves(view):
    from models.registry import Principal
    from pipelines.generation.submission import SubmitGeneration, submit_generation
    rollouts.start(view, alias="tiny", candidate_revision=CANDIDATE, actor="ops", steps=(50.0, 100.0),
                   rollout_id="ro_sub")
    registry = view.refresh()
    principal = Principal("acme", "default", "key_1", frozenset({"generate"}))

    def submitted(user, fleet):
        cmd = SubmitGeneration(request_id=None, model_alias="tiny", prompt="hi", max_output_tokens=4, deadline_ms=None,
                               user=user)
        return submit_generation(cmd, principal=principal, registry=registry, log=view._log, counter=Counting(),
                                 default_deadline_ms=1000, fleet=fleet).request

    users = [f"u-{i}" for i in range(40)]
    both = Serving({REV, CANDIDATE})
    pinned = {u: submitted(u, both) for u in users}
    assert {r.rollout_id for r in pinned.values()} == {"ro_sub"}
    for user, request in pinned.items():
        expected = registry.route("tiny", "acme", stickiness_key("acme", "default", user))
        assert (request.model_revision, request.rollout_arm) == (expected.model_revision, expected.arm)
    assert {r.rollout_arm for r in pinned.values()} == {ARM_STABLE, ARM_CANDIDATE}
    on_candidate = [u for u, r in pinned.items() if r.rollout_arm == ARM_CANDIDATE]
    only_stable = Serving({REV})
    assert {(submitted(u, only_stable).model_revision, submitted(u, only_stable).rollout_arm) for u in on_candidate} \
        == {(REV, ARM_STABLE)}


def test_the_cli_starts_steps_shows_and_rolls_back_a_rollout_as_json_lines(tmp_path, monkeypatch, capsys):
    import json

    import api.cli.main
    from pipelines.bootstrap import Bootstrap
    from models.settings import Settings
    for name in ("LEDGERLM_EVENT_LOG_URL", "LEDGERLM_EVENT_LOG_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LEDGERLM_HOME", str(tmp_path))
    with Bootstrap(Settings()).event_log() as log:
        v = RegistryView(log)
        for revision in (REV, CANDIDATE):
            admin.approve_model(v, alias="tiny", model_revision=revision, model_path="/m",
                                engine_config_hash=revision, max_model_len=512, actor="ops")
        admin.set_alias(v, alias="tiny", model_revision=REV, actor="ops")

    def cli(*argv) -> tuple[int, list[dict], str]:
        code = api.cli.main.main(list(argv))
        out = capsys.readouterr()
        return code, [json.loads(line) for line in out.out.splitlines()], out.err

    code, [shown], _ = cli("rollout", "start", "tiny", CANDIDATE, "--steps", "10,50,100", "--min-samples", "20",
                           "--min-median-similarity", "0.8")
    assert code == 0 and (shown["weight_percent"], shown["guardrails"]["min_samples"]) == (10.0, 20)
    assert shown["guardrails"]["min_median_similarity"] == 0.8
    code, _, err = cli("rollout", "start", "tiny", CANDIDATE)
    assert code == 2 and "under way" in err
    assert cli("rollout", "step", "tiny")[1][0]["weight_percent"] == 50.0
    code, [status], _ = cli("rollout", "status", "tiny")
    assert code == 0 and status["status"] == "progressing" and status["step"] == 1
    assert cli("rollout", "rollback", "tiny", "--reason", "latency")[1][0]["status"] == "rolled back"
    assert cli("rollout", "status")[1] == [], "nothing open"
    [ended] = cli("rollout", "status", "--all")[1]
    assert ended["history"][-1]["reason"] == "latency"
    code, _, err = cli("route", "drain", REV)
    assert code == 2 and "nowhere else to go" in err

    table = tmp_path / "evals.csv"
    table.write_text(f"task,model_revision,score,samples\nqa,{REV},0.9,100\nqa,{CANDIDATE},0.8,100\n")
    code, [uploaded], _ = cli("admin", "eval", "upload", str(table))
    assert code == 0 and (uploaded["rows"], uploaded["source"]) == (2, "evals.csv")
    code, shown, _ = cli("admin", "eval", "show", "--revision", CANDIDATE)
    assert [(r["task"], r["score"]) for r in shown] == [("qa", 0.8)]
    table.write_text("task,model_revision,score\nqa,nope@1,0.5\n")
    code, _, err = cli("admin", "eval", "upload", str(table))
    assert code == 2 and "not approved" in err
    code, [started], _ = cli("rollout", "start", "tiny", CANDIDATE, "--max-eval-score-drop", "0.05")
    assert code == 0 and started["guardrails"]["max_eval_score_drop"] == 0.05
    code, _, err = cli("rollout", "replace", "tiny", CANDIDATE)
    assert code == 2 and "candidate already" in err


def test_a_shadow_rollout_serves_stable_and_copies_a_share_to_the_candidate_on_the_platform_s_account(view):
    from models import topics
    from models.events import decode
    from models.registry import Principal
    from models.rollout import SHADOW_TENANT
    from models.reservations import ReservationBook
    from pipelines.admission.processor import handle_requested
    from pipelines.generation.submission import SubmitGeneration, submit_generation

    rollouts.start(view, alias="tiny", candidate_revision=CANDIDATE, actor="ops", mode="shadow", steps=(50.0, 100.0),
                   rollout_id="ro_shadow")
    registry = view.refresh()
    principal = Principal("acme", "default", "key_1", frozenset({"generate"}))
    users = [f"u-{i}" for i in range(40)]
    primaries = [submit_generation(SubmitGeneration(request_id=None, model_alias="tiny", prompt="hi",
                                                    max_output_tokens=4, deadline_ms=None, user=u),
                                   principal=principal, registry=registry, log=view._log, counter=Counting(),
                                   default_deadline_ms=1000, fleet=Serving({REV, CANDIDATE})).request for u in users]
    assert {(r.model_revision, r.rollout_arm) for r in primaries} == {(REV, ARM_STABLE)}, "clients get stable"
    requested = [decode(rec.value) for rec in view._log.read_topic(topics.REQUESTS.name)]
    shadows = [env for env in requested if env.payload.shadow_of is not None]
    mirrored = {r.request_id for u, r in zip(users, primaries)
                if registry.open_rollouts["tiny"].mirrors(stickiness_key("acme", "default", u))}
    assert 0 < len(mirrored) < len(users)
    assert {env.payload.shadow_of for env in shadows} == mirrored
    assert {(env.tenant_id, env.payload.model_revision, env.payload.rollout_arm) for env in shadows} == \
        {(SHADOW_TENANT, CANDIDATE, ARM_CANDIDATE)}

    class Free:
        def __init__(self, free):
            self.free = free

        def free_now(self, key, *, asked_at):
            return self.free

        def check(self, req, *, pool, asked_at, now, **_):
            return None

    book = ReservationBook()
    busy = handle_requested(shadows[0], registry=registry, book=book, now=T0, grace=timedelta(seconds=5),
                            capacity=Free(False))
    assert {env.payload.reason for _, env in busy if env.event_type == "GenerationRejected"} == {"shadow_dropped"}
    assert "BudgetReserved" not in [env.event_type for _, env in busy], "dropped, never queued"
    ran = handle_requested(shadows[1], registry=registry, book=book, now=T0, grace=timedelta(seconds=5),
                           capacity=Free(True))
    assert [topic.name for topic, _ in ran][-1] == topics.work_topic(None, "normal", CANDIDATE).name
    assert set(book.usage) == {SHADOW_TENANT}, "the copy's reservation is the platform account's, not the tenant's"
    client_copy = next(env for env in requested if env.correlation_id == primaries[0].request_id)
    assert handle_requested(client_copy, registry=registry, book=book, now=T0, grace=timedelta(seconds=5),
                            capacity=Free(False))[0][1].event_type == "BudgetReserved", \
        "a tenant's request is never dropped for want of a free slot"


def test_a_replaced_candidate_restarts_the_rollout_at_its_first_step_and_a_stale_verdict_is_not_written(view):
    third = "tiny@third"
    admin.approve_model(view, alias="tiny-third", model_revision=third, model_path="/m", engine_config_hash=third,
                        max_model_len=512, actor="ops")
    rollouts.start(view, alias="tiny", candidate_revision=CANDIDATE, actor="ops", steps=(10.0, 50.0, 100.0),
                   rollout_id="ro_rep")
    rollouts.step(view, alias="tiny", actor="ops")
    rollouts.pause(view, alias="tiny", actor="ops")
    before = view.refresh().open_rollouts["tiny"]
    on_candidate = {k for k in KEYS if view.registry.route("tiny", "acme", k).arm == ARM_CANDIDATE}
    stale, stepped_at = (before.rollout_id, before.step, before.candidate_revision), before.stepped_at
    for bad, refusal in ((REV, AdminConflict), (CANDIDATE, AdminConflict), ("never@approved", AdminNotFound)):
        with pytest.raises(refusal):
            rollouts.replace(view, alias="tiny", candidate_revision=bad, actor="ops")

    rollouts.replace(view, alias="tiny", candidate_revision=third, actor="ops")
    state = view.refresh().open_rollouts["tiny"]
    assert (state.candidate_revision, state.step, state.weight_percent, state.paused) == (third, 0, 10.0, None)
    assert state.stepped_at > stepped_at, "the analysis window starts at the replacement"
    assert state.history[-1]["event"] == "candidate_replaced" and state.history[-1]["replaced_revision"] == CANDIDATE
    routed = {k: view.registry.route("tiny", "acme", k) for k in KEYS}
    now_on = {k for k, r in routed.items() if r.arm == ARM_CANDIDATE}
    assert now_on < on_candidate, "back at the first step's share, the same callers first"
    assert {routed[k].model_revision for k in now_on} == {third}
    with pytest.raises(AdminConflict, match="moved on"):  # a verdict reached on the old candidate
        rollouts.step(view, alias="tiny", actor="controller", expected=(stale[0], 0, CANDIDATE))
    rollouts.step(view, alias="tiny", actor="controller", expected=(stale[0], 0, third))
    assert view.refresh().open_rollouts["tiny"].weight_percent == 50.0


def test_eval_tables_are_recorded_whole_or_not_at_all_and_the_latest_row_wins(view):
    from pipelines.rollouts import evals

    rows = evals.parse_table("task,model_revision,score,samples\nsummarize,%s,0.8,200\nsummarize,%s,0.7,200\n"
                             % (REV, CANDIDATE))
    evals.record(view, rows=rows, source="nightly-1", actor="ops")
    assert evals.compared(view.refresh(), REV, CANDIDATE) == {"summarize": (0.8, 0.7)}
    evals.record(view, rows=evals.parse_table('{"task": "summarize", "model_revision": "%s", "score": 0.79}\n'
                                              '{"task": "qa", "model_revision": "%s", "score": 0.5}' % (CANDIDATE, REV)),
                 source="nightly-2", actor="ops")
    assert evals.compared(view.refresh(), REV, CANDIDATE) == {"qa": (0.5, None), "summarize": (0.8, 0.79)}
    shown = evals.table(view.registry, task="summarize")
    assert sorted((r["model_revision"], r["score"], r["source"]) for r in shown) == sorted([
        (CANDIDATE, 0.79, "nightly-2"), (REV, 0.8, "nightly-1")])
    before = view.registry.evals
    for bad, said in (([{"task": "t", "model_revision": REV, "score": 1.5}], "score"),
                      ([{"task": "t", "model_revision": "nope@1", "score": 0.5}], "not approved"),
                      ([{"task": "t", "model_revision": REV, "score": 0.5}] * 2, "twice"),
                      ([{"task": "t", "model_revision": REV, "score": 0.5, "extra": 1}], "extra"),
                      ([], "rows")):
        with pytest.raises(AdminError, match=said):
            evals.record(view, rows=bad, source="bad", actor="ops")
    assert view.refresh().evals == before, "nothing of a refused table is recorded"
    for text, said in (("", "empty"), ("task,score\nx,1", "model_revision"), ('{"task": 1}\n{oops', "line 2")):
        with pytest.raises(AdminError, match=said):
            evals.parse_table(text)
