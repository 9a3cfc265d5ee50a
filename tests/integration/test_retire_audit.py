"""A retirement and an alias deletion are admin events: projected onto the admin history
(who, what, why) and chained into the audit trail, on both logs and both databases; the
admin commands refuse unknown names and a second retirement."""
from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from models.tables import admin_changes
from pipelines.admin import commands as admin
from pipelines.admin.commands import RegistryView
from pipelines.projections.queries import audit_events
from tests.integration.conftest_ledger import project

NEW_TYPES = ["ModelRevisionRetired", "ModelAliasDeleted"]


def test_retire_and_delete_reach_the_admin_history_and_the_audit_trail(ledger_log, ledger_dbs):
    log = ledger_log()
    view = RegistryView(log)
    try:
        admin.approve_model(view, alias="tiny", model_revision="tiny@1", model_path="/m", engine_config_hash="h1",
                            max_model_len=512, actor="root")
        admin.set_alias(view, alias="tiny-old", model_revision="tiny@1", actor="root")
        retired = admin.retire_revision(view, model_revision="tiny@1", actor="ops/key_1", reason="superseded")
        deleted = admin.delete_alias(view, alias="tiny-old", actor="ops/key_2")

        registry = view.refresh()
        assert registry.retired == {"tiny@1": "superseded"} and "tiny-old" not in registry.aliases
        with pytest.raises(admin.AdminConflict, match="already retired"):
            admin.retire_revision(view, model_revision="tiny@1", actor="ops")
        with pytest.raises(admin.AdminNotFound, match="'nope@1'"):
            admin.retire_revision(view, model_revision="nope@1", actor="ops")
        with pytest.raises(admin.AdminNotFound, match="'tiny-old'"):
            admin.delete_alias(view, alias="tiny-old", actor="ops")
        with pytest.raises(admin.AdminConflict, match="retired"):
            admin.approve_model(view, alias="tiny", model_revision="tiny@1", model_path="/m",
                                engine_config_hash="h1", max_model_len=512, actor="root")
        with pytest.raises(admin.AdminConflict, match="retired"):
            admin.set_alias(view, alias="tiny", model_revision="tiny@1", actor="root")

        url = ledger_dbs.new()
        project(log, url)
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                rows = conn.execute(sa.select(admin_changes).where(admin_changes.c.event_type.in_(NEW_TYPES))
                                    .order_by(admin_changes.c.offset)).mappings().all()
            trail, _ = audit_events(engine, tenant_id=None, types=NEW_TYPES)
        finally:
            engine.dispose()
        assert [(r["event_type"], r["actor"], r["subject"]) for r in rows] == [
            ("ModelRevisionRetired", "ops/key_1", "tiny@1"), ("ModelAliasDeleted", "ops/key_2", "tiny-old")]
        assert json.loads(rows[0]["details"])["reason"] == "superseded"

        assert [item["event_id"] for item in trail] == [str(retired.event_id), str(deleted.event_id)]
        assert json.loads(trail[0]["event"])["payload"] == {"model_revision": "tiny@1", "actor": "ops/key_1",
                                                            "reason": "superseded"}
    finally:
        view.close()
        log.close()
