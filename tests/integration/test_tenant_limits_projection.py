"""The quotas projection shows every limit in force, the fair-share weight and the right to
send `high` included, with their defaults for events written before they existed."""
from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa

from models import topics
from models.events import encode, new_event
from models.events_admin import TenantLimitsChanged
from models.tables import metadata
from pipelines.eventlog import Record
from pipelines.projections.base import parse_record, schema_versions
from pipelines.projections.queries import tenant_quota
from pipelines.projections.quotas import QuotasProjection
from tests.golden.samples import HERE

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def admin_record(offset: int, value: bytes):
    return parse_record(Record(topics.ADMIN.name, 0, offset, "k", value, 0), schema_versions())


def test_quota_limits_show_weight_and_high_priority_with_their_defaults(tmp_path):
    db = sa.create_engine(f"sqlite:///{tmp_path / 'projections.db'}")
    metadata.create_all(db)
    granted = new_event(TenantLimitsChanged(tenant_id="acme", max_concurrent=4, fair_share_weight=3.0,
                                            may_send_high=True, actor="ops"), tenant_id="acme", correlation_id="a")
    old = (HERE / "TenantLimitsChanged.v1.json").read_bytes().rstrip(b"\n")  # names neither field
    with db.begin() as conn:
        QuotasProjection().apply(conn, [admin_record(0, encode(granted)), admin_record(1, old)])
    acme = tenant_quota(db, "acme", NOW)["limits"]
    assert (acme["max_concurrent"], acme["fair_share_weight"], acme["may_send_high"]) == (4, 3.0, True)
    older = tenant_quota(db, "tenant_id-1", NOW)["limits"]  # the golden sample's tenant
    assert (older["fair_share_weight"], older["may_send_high"]) == (1.0, False)
    never = tenant_quota(db, "nobody", NOW)["limits"]
    assert (never["fair_share_weight"], never["may_send_high"], never["max_concurrent"]) == (1.0, False, None)
    db.dispose()
