"""Digests of prompt and output text on durable topics, keyed per tenant.

A plain SHA-256 of a short prompt ("yes", a name, a number) is confirmed by hashing
guesses, and durable topics are kept for good. So each digest is an HMAC-SHA256 under a
secret of the tenant's own, derived from the platform's `digest_key`: without the
platform secret no guess can be checked, and one tenant's digests say nothing about
another's equal text. The same text of the same tenant still has the same digest, so
equal prompts can be told apart from different ones by whoever holds the log.
"""
from __future__ import annotations

import hashlib
import hmac
from functools import lru_cache

DEV_DIGEST_KEY = "dev-only-digest-key"  # the settings' default; set LEDGERLM_DIGEST_KEY
_LABEL = b"ledgerlm-text-digest-v1\0"


class TenantDigests:
    def __init__(self, platform_secret: str):
        if not platform_secret:
            raise ValueError("the digest key is empty")
        self._secret = platform_secret.encode()
        self.key_for = lru_cache(maxsize=4096)(self._derive)

    def _derive(self, tenant_id: str) -> bytes:
        return hmac.new(self._secret, _LABEL + tenant_id.encode(), hashlib.sha256).digest()

    def hasher(self, tenant_id: str):
        """An incremental digest (`update`, `hexdigest`), as hashlib's, for streamed text."""
        return hmac.new(self.key_for(tenant_id), digestmod=hashlib.sha256)

    def hexdigest(self, tenant_id: str, text: str) -> str:
        return hmac.new(self.key_for(tenant_id), text.encode(), hashlib.sha256).hexdigest()
