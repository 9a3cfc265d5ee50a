"""The rules of who administers what, key expiry, and suspension, as the registry applies
them: an operator's grant, a tenant's own limits within it, keys that expire, tenants
that are suspended, and the sweep that cancels a suspended tenant's work."""
from __future__ import annotations

from datetime import timedelta

from models import topics
from models.authz import beyond_grant, is_operator, is_tenant_admin, tighten, ungrantable_scopes
from models.events import new_event
from models.events_admin import (
    ApiKeyExpirySet, ApiKeyIssued, TenantLimitsChanged, TenantOwnLimitsChanged, TenantReinstated, TenantSuspended,
)
from models.quota import Limits
from models.registry import hash_secret
from models.reservations import ReservationBook
from pipelines.admission.processor import handle_requested
from pipelines.admission.suspension import SuspensionSweep
from tests.unit.test_admission import GRACE, T0, registry, requested, types


def apply(reg, payload):
    reg.apply(new_event(payload, tenant_id="acme", correlation_id="admin"))
    return reg


def test_admin_means_operator_and_a_tenant_admin_issues_no_operator_scope():
    assert is_operator({"admin"}) and is_operator({"operator", "usage"}) and not is_operator({"tenant_admin"})
    assert is_tenant_admin({"tenant_admin"}) and not is_tenant_admin({"generate"})
    assert ungrantable_scopes(["generate", "tenant_admin", "audit"]) == set()
    assert ungrantable_scopes(["generate", "admin", "operator"]) == {"admin", "operator"}


def test_own_limits_only_tighten_the_grant():
    grant = Limits(max_concurrent=4, tokens_per_window=1000, pool="gold")
    assert beyond_grant(grant, {"max_concurrent": 5, "tokens_per_window": 1000, "requests_per_minute": 10**6}) == {
        "max_concurrent": (5, 4)}, "no grant on a field leaves the tenant free to set its own"
    assert beyond_grant(grant, {"max_concurrent": None}) == {}
    tight = tighten(grant, {"max_concurrent": 2, "requests_per_minute": 60})
    assert (tight.max_concurrent, tight.tokens_per_window, tight.requests_per_minute, tight.pool) == (2, 1000, 60, "gold")
    assert tighten(grant, None) == grant


def test_the_registry_applies_the_lower_of_grant_and_own_limits_whatever_their_order():
    reg = registry(max_concurrent=4)
    apply(reg, TenantOwnLimitsChanged(tenant_id="acme", actor="acme/k", max_concurrent=2, max_output_tokens=50))
    assert reg.limits_for("acme").max_concurrent == 2 and reg.limits_for("acme").max_output_tokens == 50
    assert reg.grant_for("acme").max_concurrent == 4 and reg.grant_for("acme").max_output_tokens is None
    apply(reg, TenantLimitsChanged(tenant_id="acme", actor="ops", max_concurrent=1, max_output_tokens=100))
    assert reg.limits_for("acme").max_concurrent == 1, "an operator lowering the grant below the own limit wins"
    assert reg.limits_for("acme").max_output_tokens == 50
    apply(reg, TenantOwnLimitsChanged(tenant_id="acme", actor="acme/k"))
    assert reg.limits_for("acme") == reg.grant_for("acme")


def test_a_key_stops_authenticating_at_its_expiry():
    reg = registry()
    apply(reg, ApiKeyIssued(key_id="k1", tenant_id="acme", secret_sha256=hash_secret("s1"), scopes=("generate",),
                            actor="ops", expires_at=T0 + timedelta(hours=1)))
    apply(reg, ApiKeyIssued(key_id="k2", tenant_id="acme", secret_sha256=hash_secret("s2"), scopes=("generate",),
                            actor="ops", rotated_from="k1"))
    assert reg.authenticate("s1", now=T0).key_id == "k1"
    assert reg.authenticate("s1", now=T0 + timedelta(hours=1)) is None
    assert reg.authenticate("s2", now=T0 + timedelta(days=999)).key_id == "k2"
    apply(reg, ApiKeyExpirySet(key_id="k2", tenant_id="acme", expires_at=T0, actor="ops"))
    assert reg.authenticate("s2", now=T0) is None and reg.authenticate("s2", now=T0 - timedelta(seconds=1))


def test_a_suspended_tenant_is_rejected_at_admission_until_reinstated():
    reg = apply(registry(), TenantSuspended(tenant_id="acme", actor="ops", reason="unpaid"))
    assert reg.suspended == {"acme": "unpaid"}
    out = handle_requested(requested("r1"), registry=reg, book=ReservationBook(), now=T0, grace=GRACE)
    assert types(out) == [(topics.LEDGER.name, "GenerationRejected"), (topics.STREAM.name, "GenerationRejected")]
    assert out[0][1].payload.reason == "tenant_disabled"
    apply(reg, TenantReinstated(tenant_id="acme", actor="ops"))
    out = handle_requested(requested("r2"), registry=reg, book=ReservationBook(), now=T0, grace=GRACE)
    assert types(out)[0] == (topics.LEDGER.name, "BudgetReserved")


class FixedView:
    def __init__(self, reg):
        self.registry = reg

    def refresh(self):
        return self.registry


def test_the_sweep_cancels_each_open_request_of_a_suspended_tenant_once():
    reg, book = registry(), ReservationBook()
    for rid in ("r1", "r2"):
        handle_requested(requested(rid), registry=reg, book=book, now=T0, grace=GRACE)
    sweep = SuspensionSweep(FixedView(reg))
    assert sweep.cancels(book, monotonic=0.0) == []
    apply(reg, TenantSuspended(tenant_id="acme", actor="ops"))
    assert sweep.cancels(book, monotonic=0.1) == [], "looked again only after EVERY_S"
    out = sweep.cancels(book, monotonic=1.0)
    assert sorted(env.payload.request_id for _, env in out) == ["r1", "r2"]
    assert {(topic.name, env.event_type, env.payload.reason) for topic, env in out} == {
        (topics.REQUESTS.name, "CancelRequested", "admin")}
    assert sweep.cancels(book, monotonic=2.0) == [], "asked once"
