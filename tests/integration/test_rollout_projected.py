"""A rollout's history, projected: the admin history holds each of its events under the
rollout's id, in the order the registry applied them (the routing table and the SQL say
the same), and a replay of the log rebuilds the same tables."""
from __future__ import annotations

from pipelines.admin import commands as admin

from pipelines.rollouts import commands as rollouts
from pipelines.admin.commands import RegistryView
from pipelines.audit.digest import table_digests
from pipelines.audit.replay import replay
from pipelines.projections.queries import rollout_history
from pipelines.projections.sql import open_projection_db
from tests.integration.conftest_ledger import EVERY, SIGNER, project

EVENT_OF = {"started": "RolloutStarted", "stepped": "RolloutStepped", "paused": "RolloutPaused",
            "resumed": "RolloutResumed", "promoted": "RolloutPromoted", "rolled_back": "RolloutRolledBack",
            "candidate_replaced": "RolloutCandidateReplaced"}


def test_a_rollout_s_history_in_sql_is_the_registry_s_and_replays_the_same(embedded_ledger_log, ledger_dbs):
    log = embedded_ledger_log()
    view = RegistryView(log)
    url = ledger_dbs.new()
    for revision in ("tiny@a", "tiny@b", "tiny@c"):
        admin.approve_model(view, alias="chat", model_revision=revision, model_path="/m", engine_config_hash=revision,
                            max_model_len=512, actor="ops")
    admin.set_alias(view, alias="chat", model_revision="tiny@a", actor="ops")
    rollouts.start(view, alias="chat", candidate_revision="tiny@b", actor="ops", steps=(10.0, 50.0, 100.0),
                   rollout_id="ro_sql")
    rollouts.step(view, alias="chat", actor="ops")
    rollouts.replace(view, alias="chat", candidate_revision="tiny@c", actor="ops")
    project(log, url)
    rollouts.pause(view, alias="chat", actor="rollout-analysis", reason="inconclusive", detail="3 of 50")
    rollouts.resume(view, alias="chat", actor="ops")
    rollouts.step(view, alias="chat", actor="ops")
    rollouts.promote(view, alias="chat", actor="ops")
    project(log, url)

    registry = view.refresh()
    assert registry.aliases["chat"].model_revision == "tiny@c", "promoted: the alias moved to the replacement"
    engine = open_projection_db(url)
    try:
        projected = rollout_history(engine, "ro_sql")
        assert [r["event_type"] for r in projected] == \
            [EVENT_OF[h["event"]] for h in registry.rollouts["ro_sql"].history]
        assert projected[2]["details"]["replaced_revision"] == "tiny@b"
        assert projected[3]["details"]["reason"] == "inconclusive" and projected[3]["actor"] == "rollout-analysis"
        assert projected[-1]["event_type"] == "RolloutPromoted"
        live = table_digests(engine)
    finally:
        engine.dispose()
    assert replay(log, ledger_dbs.new(migrate=False), SIGNER, checkpoint_every=EVERY).digests == live
