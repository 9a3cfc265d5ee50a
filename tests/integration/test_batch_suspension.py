"""A suspended tenant's batches end as cancelled: the dispatcher asks for the cancel
itself, running chunks are stopped, and every queued chunk's reservation settles once."""
from __future__ import annotations

from collections import Counter

import pytest

from models.events_batch import BatchChunkQueued, BatchUsageSettled
from pipelines.admin.tenants import suspend_tenant
from tests.integration.test_batch_dispatcher import TENANT, line, of, rig  # noqa: F401 - `rig` is a fixture


@pytest.fixture
def dispatch_rig(tmp_path, tiny_model_dir, request):
    """`test_batch_dispatcher`'s `rig`: a dispatcher on an embedded log, tasks run by hand."""
    return request.getfixturevalue("rig")


def test_a_suspended_tenants_batch_is_cancelled_and_settles_once(dispatch_rig):
    dispatcher = dispatch_rig.dispatcher()
    batch_id = dispatch_rig.submit([line(i) for i in range(6)])
    dispatch_rig.drive(dispatcher, batch_id, run_tasks=False, until=lambda b: len(b.in_flight()) == 2)
    dispatch_rig.run_task(dispatch_rig.queue.tasks.pop(0))
    suspend_tenant(dispatcher._registry_view, tenant_id=TENANT, actor="ops", reason="unpaid")
    batch = dispatch_rig.drive(dispatcher, batch_id)
    assert batch.status == "cancelled", batch.status
    events = dispatch_rig.events(batch_id)
    settled = Counter(p.reservation_id for p in of(events, BatchUsageSettled))
    assert settled == Counter(p.reservation_id for p in of(events, BatchChunkQueued)) and max(settled.values()) == 1
