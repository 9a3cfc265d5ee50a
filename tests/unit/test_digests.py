"""Text digests keyed per tenant: the same text of one tenant always digests the same, and
nothing without the platform secret (a plain SHA-256, another tenant, another secret)
reproduces it, so a digest on the log cannot confirm a guessed short prompt."""
from __future__ import annotations

import hashlib

from models.digests import TenantDigests
from models.settings import Settings
from pipelines.generation import idempotency


def test_a_digest_is_stable_per_tenant_and_unguessable_without_the_secret():
    digests = TenantDigests("platform-secret")
    mine = digests.hexdigest("acme", "yes")
    assert mine == TenantDigests("platform-secret").hexdigest("acme", "yes") and len(mine) == 64
    assert mine != hashlib.sha256(b"yes").hexdigest()
    assert mine != digests.hexdigest("globex", "yes"), "equal text of two tenants digests apart"
    assert mine != TenantDigests("another-secret").hexdigest("acme", "yes")
    assert mine != digests.hexdigest("acme", "no")


def test_the_streamed_digest_equals_the_whole_one():
    digests = TenantDigests("platform-secret")
    hasher = digests.hasher("acme")
    for piece in ("Once ", "upon ", "a time"):
        hasher.update(piece.encode())
    assert hasher.hexdigest() == digests.hexdigest("acme", "Once upon a time")


def test_the_idempotency_body_hash_is_keyed_too():
    digests = TenantDigests("platform-secret")
    body = {"input": "yes", "max_output_tokens": 1}
    keyed = idempotency.request_sha256("generations", body, digests.key_for("acme"))
    assert keyed == idempotency.request_sha256("generations", {"max_output_tokens": 1, "input": "yes"},
                                               digests.key_for("acme"))
    assert keyed != idempotency.request_sha256("generations", body)
    assert keyed != idempotency.request_sha256("generations", body, digests.key_for("globex"))


def test_without_a_digest_key_the_secret_is_derived_from_the_audit_signing_key(tmp_path):
    own = TenantDigests.from_settings(Settings(home=tmp_path, audit_signing_key="a-real-secret"))
    other = TenantDigests.from_settings(Settings(home=tmp_path, audit_signing_key="another-secret"))
    assert own.hexdigest("acme", "yes") != other.hexdigest("acme", "yes")
    assert TenantDigests.from_settings(Settings(home=tmp_path)).hexdigest("acme", "yes") == \
        TenantDigests.development().hexdigest("acme", "yes")
    chosen = TenantDigests.from_settings(Settings(home=tmp_path, digest_key="mine", audit_signing_key="x"))
    assert chosen.hexdigest("acme", "yes") == TenantDigests("mine").hexdigest("acme", "yes")
