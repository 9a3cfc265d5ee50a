"""The limits catalogue (`models.limits`) drives every reader of a tenant's limits: the
policy's record and checks, the tenant admin's own limits, the two limits events, the
quotas projection and its table, the admin route's body, the CLI's flags and the console's
limits page. Each test walks the whole catalogue, so a limit declared there that a reader
ignores fails here."""
from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import datetime, timezone

import pytest

from api.cli.admin import add_admin_parser, limit_flag
from api.console.pages import limits_context
from api.console.render import environment
from api.routes.admin import LimitsBody
from models import topics
from models.authz import beyond_grant, tighten
from models.events import encode, new_event
from models.events_admin import TenantLimitsChanged, TenantOwnLimitsChanged
from models.limits import BY_NAME, LIMIT_FIELDS, LIMITS, OWN_LIMIT_FIELDS, LimitSpec, _validate, checked_by
from models.quota import APPLIED_ELSEWHERE, REQUEST_CHECKS, USE_CHECKS, Ask, Limits, Reject, TenantUsage, decide
from models.registry import Registry
from models.tables import tenant_limits
from pipelines.eventlog import Record
from pipelines.projections.base import parse_record, schema_versions
from pipelines.projections.queries import limits_in_use
from pipelines.projections.quotas import fold_limits

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
# A value of each unit that is set, valid and not the default, as a value and as a flag's text.
SAMPLES = {"requests": (7, "7"), "tokens": (700, "700"), "micros": (7_000_000, "7000000"), "seconds": (120, "120"),
           "weight": (2.5, "2.5"), "yes_no": (True, "yes"), "pool": ("gold", "gold")}
# The limits of the events' first shape: a limit added since is `late`, or the events it
# would join would change their bytes.
FIRST_SHAPE = ("requests_per_minute", "max_concurrent", "tokens_per_window", "spend_per_window_micros",
               "window_seconds", "max_input_tokens", "max_output_tokens", "batch_tokens_per_window", "pool")


def sample(spec: LimitSpec):
    return SAMPLES[spec.unit][0]


def every_limit_set() -> dict:
    return {spec.name: sample(spec) for spec in LIMITS}


def test_the_catalogue_is_consistent():
    assert LIMIT_FIELDS == tuple(spec.name for spec in LIMITS) and set(BY_NAME) == set(LIMIT_FIELDS)
    assert set(SAMPLES) >= {spec.unit for spec in LIMITS}, "a new unit needs a sample here"
    assert {spec.level for spec in LIMITS} == {"tenant"}, "every reader applies limits per tenant"
    assert OWN_LIMIT_FIELDS == tuple(spec.name for spec in LIMITS if spec.own)
    assert all(spec.ceiling and spec.kind is int for spec in LIMITS if spec.own)
    assert tuple(spec.name for spec in LIMITS if not spec.late) == FIRST_SHAPE


@pytest.mark.parametrize("spec,says", [
    (LimitSpec("x", "furlongs", "rate", label="x", help="x"), "unknown unit"),
    (LimitSpec("x", "tokens", "window", label="x", help="x", reason="r", refusal="m"), "names its measure"),
    (LimitSpec("x", "tokens", "window", measure="input_tokens", label="x", help="x", reason="r", refusal="m"),
     "tokens and cost_micros only"),
    (LimitSpec("x", "requests", "rate", label="x", help="x"), "a reason and a refusal"),
    (LimitSpec("x", "pool", "standing", own=True, label="x", help="x"), "only a ceiling"),
    (LimitSpec("x", "tokens", "batch", column="text", label="x", help="x"), "column 'text'"),
])
def test_a_malformed_entry_is_refused_with_what_is_wrong(spec, says):
    with pytest.raises(ValueError, match=says):
        _validate((spec,))


def test_a_limit_declared_twice_is_refused():
    _validate(LIMITS)
    with pytest.raises(ValueError, match="declared twice"):
        _validate((*LIMITS, LIMITS[0]))


def test_the_record_has_every_limit_with_its_default():
    assert tuple(f.name for f in dataclasses.fields(Limits)) == LIMIT_FIELDS
    unset = Limits()
    assert unset.as_dict() == {spec.name: spec.default for spec in LIMITS}
    assert Limits(**every_limit_set()).as_dict() == every_limit_set()


def test_both_events_carry_their_limits_and_older_bytes_stay_as_they_were():
    grant_fields = list(TenantLimitsChanged.model_fields)
    assert grant_fields == (["tenant_id", *FIRST_SHAPE, "actor"]
                            + [spec.name for spec in LIMITS if spec.late])
    own_fields = list(TenantOwnLimitsChanged.model_fields)
    assert own_fields == ["tenant_id", *[spec.name for spec in LIMITS if spec.own and not spec.late], "actor",
                          *[spec.name for spec in LIMITS if spec.own and spec.late]]
    granted = TenantLimitsChanged(tenant_id="t", actor="ops", **every_limit_set())
    assert Limits.from_payload(granted).as_dict() == every_limit_set()
    unset = json.loads(TenantLimitsChanged(tenant_id="t", actor="ops").model_dump_json())
    assert set(unset) == {"tenant_id", "actor", *FIRST_SHAPE}, "a late limit unset is not in the bytes"
    assert Limits.from_payload(TenantLimitsChanged(tenant_id="t", actor="ops")) == Limits()


def test_every_admission_check_refuses_at_its_limit_and_every_other_kind_is_applied_somewhere():
    checks = {**REQUEST_CHECKS, **USE_CHECKS}
    for spec in LIMITS:
        assert spec.check in checks or spec.check in APPLIED_ELSEWHERE, spec.name
    for spec in checked_by(*checks):
        usage = TenantUsage()
        got = decide(Ask(1, 1, 1), usage, Limits(**{spec.name: 0}), NOW)
        assert isinstance(got, Reject) and got.reason == spec.reason, spec.name
        assert decide(Ask(1, 1, 1), usage, Limits(**{spec.name: 10**9}), NOW).admitted, spec.name
    window = decide(Ask(1, 1, 1), TenantUsage(), Limits(tokens_per_window=0, window_seconds=120), NOW)
    assert "in the last 120 s" in window.message, "the window's length shapes the window checks"


def test_a_tenant_admin_tightens_every_own_limit_and_no_other():
    grant = Limits(**{spec.name: 5 if spec.own else sample(spec) for spec in LIMITS})
    own = {name: 3 for name in OWN_LIMIT_FIELDS}
    in_force = tighten(grant, own)
    for spec in LIMITS:
        assert getattr(in_force, spec.name) == (3 if spec.own else sample(spec)), spec.name
    assert set(beyond_grant(grant, {name: 9 for name in OWN_LIMIT_FIELDS})) == set(OWN_LIMIT_FIELDS)
    assert TenantOwnLimitsChanged(tenant_id="t", actor="a", **own).model_dump(exclude={"tenant_id", "actor"}) == own


def _admin_event(payload, offset: int):
    env = new_event(payload, tenant_id=payload.tenant_id, correlation_id="c")
    return parse_record(Record(topics.ADMIN.name, 0, offset, "k", encode(env), 0), schema_versions())


def test_the_projection_stores_and_folds_every_limit():
    assert [c.name for c in tenant_limits.columns][1:len(LIMITS) + 1] == list(LIMIT_FIELDS)
    grant = _admin_event(TenantLimitsChanged(tenant_id="t", actor="ops", **every_limit_set()), 0)
    row = fold_limits(None, grant)
    assert {name: row[name] for name in LIMIT_FIELDS} == every_limit_set()
    assert json.loads(row["granted"]) == every_limit_set()
    tighter = _admin_event(TenantOwnLimitsChanged(tenant_id="t", actor="t-admin",
                                                  **{name: 1 for name in OWN_LIMIT_FIELDS}), 1)
    row = fold_limits(row, tighter)
    assert {name: row[name] for name in LIMIT_FIELDS} == {**every_limit_set(), **dict.fromkeys(OWN_LIMIT_FIELDS, 1)}
    unset = fold_limits(None, _admin_event(TenantLimitsChanged(tenant_id="u", actor="ops"), 2))
    assert {name: unset[name] for name in LIMIT_FIELDS} == Limits().as_dict(), "unset: each limit's default"


def test_what_remains_is_counted_for_every_use_check():
    used = limits_in_use({"requests_last_minute": 1, "tokens": 10, "cost_micros": 100},
                         {"concurrent": 2, "tokens": 20, "cost_micros": 200})
    assert set(used) == {spec.name for spec in checked_by(*USE_CHECKS)}


def test_the_admin_routes_body_takes_every_limit():
    assert tuple(LimitsBody.model_fields) == LIMIT_FIELDS
    body = LimitsBody.model_validate(every_limit_set())
    assert body.model_dump(include=body.model_fields_set) == every_limit_set()
    for spec in LIMITS:
        if spec.kind is int:
            with pytest.raises(ValueError):
                LimitsBody.model_validate({spec.name: -1})
    with pytest.raises(ValueError):
        LimitsBody.model_validate({"not_a_limit": 1})


def test_the_cli_has_a_flag_for_every_limit():
    parser = argparse.ArgumentParser(prog="ledgerlm")
    add_admin_parser(parser.add_subparsers(dest="command"))
    argv = ["admin", "limits", "set", "t"]
    for spec in LIMITS:
        argv += [limit_flag(spec.name), SAMPLES[spec.unit][1]]
    args = parser.parse_args(argv)
    assert {name: getattr(args, name) for name in LIMIT_FIELDS} == every_limit_set()
    assert not any(hasattr(parser.parse_args(argv[:4]), name) for name in LIMIT_FIELDS), "unsent: unchanged"


def test_the_console_shows_every_limit():
    registry = Registry()
    registry.grants["t"] = registry.limits["t"] = Limits(**every_limit_set())
    quota = {"used": {"requests_last_minute": 1, "tokens": 10, "cost_micros": 100},
             "reserved": {"concurrent": 2, "tokens": 20, "cost_micros": 200}}
    html = environment().get_template("limits.html").render(user=None, request=None, today=None,
                                                            **limits_context(registry, "t", quota))
    for spec in LIMITS:
        if spec.ceiling:
            assert f'data-limit="{spec.name}"' in html and spec.label in html, spec.name
        elif spec.check == "standing":
            assert f"<th>{spec.label}</th><td>{spec.shown(sample(spec))}</td>" in html, spec.name
        else:  # the window's length, said above the table
            assert spec.check == "window_length" and "a window is 2 minutes" in html
