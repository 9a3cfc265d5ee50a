"""Digests of prompt and output text on durable topics, keyed per tenant.

A plain SHA-256 of a short prompt ("yes", a name, a number) is confirmed by hashing
guesses, and durable topics are kept for good. So each digest is an HMAC-SHA256 under a
secret of the tenant's own, derived from the platform's secret: without it no guess can
be checked, and one tenant's digests say nothing about another's equal text. The same
text of the same tenant still has the same digest, so equal prompts can be told apart
from different ones by whoever holds the log.

The platform secret is the settings' `digest_key`; unset, one derived from the audit
signing key, which a shared deployment must set (the projector refuses the development
one), so digests are keyed by a secret without a setting of their own.
"""
from __future__ import annotations

import hashlib
import hmac
from functools import lru_cache

_LABEL = b"ledgerlm-text-digest-v1\0"
DEV_AUDIT_KEY = "dev-only-change-me"  # the settings' default audit signing key


def platform_secret(digest_key: str | None, audit_signing_key: str) -> str:
    if digest_key:
        return digest_key
    return hmac.new(audit_signing_key.encode(), b"ledgerlm-digest-key-v1", hashlib.sha256).hexdigest()


class TenantDigests:
    def __init__(self, platform_secret: str):
        if not platform_secret:
            raise ValueError("the digest key is empty")
        self._secret = platform_secret.encode()
        self.key_for = lru_cache(maxsize=4096)(self._derive)

    @classmethod
    def from_settings(cls, settings) -> "TenantDigests":
        return cls(platform_secret(settings.digest_key, settings.audit_signing_key))

    @classmethod
    def development(cls) -> "TenantDigests":
        """What the settings' defaults give: for callers given none (tests, tools)."""
        return cls(platform_secret(None, DEV_AUDIT_KEY))

    def _derive(self, tenant_id: str) -> bytes:
        return hmac.new(self._secret, _LABEL + tenant_id.encode(), hashlib.sha256).digest()

    def hasher(self, tenant_id: str):
        """An incremental digest (`update`, `hexdigest`), as hashlib's, for streamed text."""
        return hmac.new(self.key_for(tenant_id), digestmod=hashlib.sha256)

    def hexdigest(self, tenant_id: str, text: str) -> str:
        return hmac.new(self.key_for(tenant_id), text.encode(), hashlib.sha256).hexdigest()
