"""Retiring a revision and deleting an alias: what the registry makes of the events, what
admission does with a request pinned to a retired revision, and the submission's error."""
from __future__ import annotations

import pytest

from models import topics
from models.events import new_event
from models.events_admin import ModelAliasDeleted, ModelAliasSet, ModelRevisionApproved, ModelRevisionRetired
from models.events_generation import GenerationRejected
from models.registry import Principal, Registry
from models.reservations import ReservationBook
from pipelines.admission.processor import handle_requested, handle_terminal
from pipelines.generation.submission import SubmissionError, SubmitGeneration, submit_generation
from tests.unit.test_admission import GRACE, REV, T0, completed, registry, requested, types

OTHER = "tiny@def"


def apply(reg: Registry, *payloads) -> Registry:
    for payload in payloads:
        reg.apply(new_event(payload, tenant_id="_platform", correlation_id="admin"))
    return reg


def retired(reg: Registry, revision: str = REV, reason: str | None = None) -> Registry:
    return apply(reg, ModelRevisionRetired(model_revision=revision, actor="ops", reason=reason))


def test_a_retired_revision_stays_known_but_cannot_be_pinned():
    reg = retired(registry(), reason="superseded")
    assert REV in reg.revisions, "usage, settlement and audit still name it"
    assert reg.retired == {REV: "superseded"}
    assert reg.pinnable(REV) is None
    assert reg.resolve_alias("tiny", "acme") is None
    assert reg.retired_behind("tiny", "acme") == REV
    assert reg.aliases_for("acme") == [], "an alias of a retired revision is not offered"


def test_retirement_is_final():
    reg = retired(registry())
    apply(reg, ModelRevisionApproved(model_revision=REV, model_path="/elsewhere", engine_config_hash="zzz",
                                     max_model_len=64, actor="ops"))
    assert reg.pinnable(REV) is None and reg.revisions[REV].model_path == "/m"


def test_re_pointing_the_alias_of_a_retired_revision_makes_it_usable_again():
    reg = retired(apply(registry(), ModelRevisionApproved(model_revision=OTHER, model_path="/n",
                                                          engine_config_hash="def", max_model_len=512,
                                                          actor="ops")))
    apply(reg, ModelAliasSet(alias="tiny", model_revision=OTHER, actor="ops"))
    assert reg.resolve_alias("tiny", "acme").model_revision == OTHER
    assert reg.retired_behind("tiny", "acme") is None


def test_retiring_an_unknown_revision_changes_nothing():
    reg = retired(registry(), revision="never@approved")
    assert reg.retired == {} and reg.resolve_alias("tiny", "acme").model_revision == REV


def test_a_deleted_alias_is_gone_and_its_revision_stays():
    reg = apply(registry(), ModelAliasDeleted(alias="tiny", actor="ops"))
    assert "tiny" not in reg.aliases
    assert reg.resolve_alias("tiny", "acme") is None and reg.retired_behind("tiny", "acme") is None
    assert reg.pinnable(REV) is not None


def test_an_alias_the_tenant_may_not_use_says_nothing_of_retirement():
    reg = retired(apply(registry(), ModelAliasSet(alias="private", model_revision=REV, allowed_tenants=("globex",),
                                                  actor="ops")))
    assert reg.retired_behind("private", "acme") is None
    assert reg.retired_behind("private", "globex") == REV


def test_admission_rejects_a_request_pinned_to_a_revision_retired_since():
    reg, book = retired(registry()), ReservationBook()
    out = handle_requested(requested("r1"), registry=reg, book=book, now=T0, grace=GRACE)
    assert types(out) == [(topics.LEDGER.name, "GenerationRejected"), (topics.STREAM.name, "GenerationRejected")]
    rejection: GenerationRejected = out[0][1].payload
    assert rejection.reason == "model_retired" and REV in rejection.message
    assert not book.open


def test_work_admitted_before_retirement_still_settles_at_its_revisions_price():
    reg, book = registry(), ReservationBook()
    handle_requested(requested("r1"), registry=reg, book=book, now=T0, grace=GRACE)
    retired(reg)
    out = handle_terminal(completed("r1", input_tokens=10, output_tokens=20), registry=reg, book=book)
    settled = out[0][1].payload
    assert settled.cost_micros == 10 + 40 and not book.open


class NoCounting:
    def count(self, model_path: str, text: str) -> int:
        return 3


def test_submission_refuses_a_retired_alias_with_410_and_a_deleted_one_with_404():
    principal = Principal("acme", "default", "key_1", frozenset({"generate"}))
    cmd = SubmitGeneration(request_id=None, model_alias="tiny", prompt="hi", max_output_tokens=4, deadline_ms=None)
    reg = retired(registry(), reason="superseded by tiny@def")
    with pytest.raises(SubmissionError) as gone:
        submit_generation(cmd, principal=principal, registry=reg, log=None, counter=NoCounting(),
                          default_deadline_ms=1000)
    assert (gone.value.status, gone.value.code) == (410, "model_retired")
    assert REV in str(gone.value) and "superseded by tiny@def" in str(gone.value)
    apply(reg, ModelAliasDeleted(alias="tiny", actor="ops"))
    with pytest.raises(SubmissionError) as unknown:
        submit_generation(cmd, principal=principal, registry=reg, log=None, counter=NoCounting(),
                          default_deadline_ms=1000)
    assert (unknown.value.status, unknown.value.code) == (404, "model_not_found")
