"""The admin events of tenant admins, key lifecycles and suspensions, projected: each is in
the admin history and the audit trail, the quotas read model shows the limits admission
applies (the grant tightened by the tenant's own, in any order), and a replay and an
audit verify of the log agree with the live projections."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from pipelines.admin import commands as admin

from pipelines.admin import tenants as admin_tenants
from pipelines.admin.commands import RegistryView
from pipelines.audit.digest import table_digests
from pipelines.audit.replay import replay
from pipelines.audit.verify import verify
from pipelines.projections.queries import tenant_quota
from pipelines.projections.sql import open_projection_db
from tests.integration.conftest_ledger import EVERY, SIGNER, project

TYPES = ("TenantOwnLimitsChanged", "ApiKeyExpirySet", "TenantSuspended", "TenantReinstated")


def test_admin_events_are_in_history_trail_and_quotas_and_replay_the_same(embedded_ledger_log, ledger_dbs):
    log = embedded_ledger_log()
    view = RegistryView(log)
    url = ledger_dbs.new()
    admin.create_tenant(view, tenant_id="acme", name="Acme", actor="ops")
    admin.set_limits(view, tenant_id="acme", actor="ops", max_concurrent=4, max_output_tokens=100)
    admin_tenants.set_own_limits(view, tenant_id="acme", actor="acme/k", max_concurrent=2)
    project(log, url)  # a batch boundary between the own limits and the grant that follows
    admin.set_limits(view, tenant_id="acme", actor="ops", max_concurrent=8, max_output_tokens=50)
    _, issued = admin.issue_key(view, tenant_id="acme", actor="ops", scopes=("generate",))
    admin_tenants.rotate_key(view, key_id=issued.payload.key_id, actor="acme/k",
                             old_valid_until=datetime.now(timezone.utc) + timedelta(hours=1))
    admin_tenants.suspend_tenant(view, tenant_id="acme", actor="ops", reason="unpaid")
    admin_tenants.reinstate_tenant(view, tenant_id="acme", actor="ops")
    project(log, url)

    in_force = view.refresh().limits_for("acme")
    assert (in_force.max_concurrent, in_force.max_output_tokens) == (2, 50)
    engine = open_projection_db(url)
    try:
        quota = tenant_quota(engine, "acme", datetime.now(timezone.utc))
        assert (quota["limits"]["max_concurrent"], quota["limits"]["max_output_tokens"]) == (2, 50)
        with engine.connect() as conn:
            history = {t for (t,) in conn.execute(sa.text("SELECT event_type FROM admin_changes"))}
            trail = {t for (t,) in conn.execute(sa.text("SELECT event_type FROM audit_trail"))}
        assert set(TYPES) <= history and set(TYPES) <= trail
        assert verify(log, engine, SIGNER, checkpoint_every=EVERY).ok
        live = table_digests(engine)
    finally:
        engine.dispose()
    assert replay(log, ledger_dbs.new(migrate=False), SIGNER, checkpoint_every=EVERY).digests == live
