"""Signing chain heads: HMAC-SHA256 with the settings' key, or Ed25519.

`settings.audit_signing_key` holding `ed25519:<urlsafe base64 of a 32-byte seed>` selects
Ed25519, so auditors can verify with the public key alone (`Ed25519Verifier`); any other
value is an HMAC key, which verifies only where the key is known. Both are deterministic,
so a replay reproduces the live trail's signatures.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from models.events import canonical


class Verifier(Protocol):
    key_id: str

    def verify(self, message: bytes, signature: str) -> bool: ...


class Signer(Verifier, Protocol):
    def sign(self, message: bytes) -> str: ...


def checkpoint_message(topic: str, partition: int, seq: int, offset: int, link: bytes) -> bytes:
    return canonical({"v": 1, "topic": topic, "partition": partition, "seq": seq, "offset": offset,
                      "link": link.hex()})


class HmacSigner:
    def __init__(self, key: bytes):
        if not key:
            raise ValueError("the audit signing key is empty")
        self._key = key
        self.key_id = "hmac:" + hashlib.sha256(b"key-id:" + key).hexdigest()[:12]

    def sign(self, message: bytes) -> str:
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def verify(self, message: bytes, signature: str) -> bool:
        return hmac.compare_digest(self.sign(message), signature)


def _public_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:12]


class Ed25519Verifier:
    def __init__(self, public: Ed25519PublicKey):
        self._public = public
        self.key_id = _public_id(public)

    @classmethod
    def from_base64(cls, text: str) -> "Ed25519Verifier":
        return cls(Ed25519PublicKey.from_public_bytes(base64.urlsafe_b64decode(text)))

    def verify(self, message: bytes, signature: str) -> bool:
        try:
            self._public.verify(bytes.fromhex(signature), message)
        except (InvalidSignature, ValueError):
            return False
        return True


class Ed25519Signer(Ed25519Verifier):
    def __init__(self, seed: bytes):
        self._private = Ed25519PrivateKey.from_private_bytes(seed)
        super().__init__(self._private.public_key())

    def sign(self, message: bytes) -> str:
        return self._private.sign(message).hex()

    def public_base64(self) -> str:
        return base64.urlsafe_b64encode(self._public.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


DEV_KEY = "dev-only-change-me"  # the settings' default: fine for the embedded quick start only


def dev_key_refused(settings) -> str | None:
    """Why a projector may not sign with these settings' key, or None. The development key
    is public, so a trail signed with it proves nothing: it is refused wherever the log or
    the database is a shared server (anything but the embedded SQLite files)."""
    if settings.audit_signing_key != DEV_KEY:
        return None
    shared = [name for name, url in (("event log", settings.event_log_url), ("database", settings.database_url))
              if not url.startswith("sqlite")]
    if not shared:
        return None
    return (f"refusing to sign the audit trail with the development key on a shared {' and '.join(shared)}: "
            "set LEDGERLM_AUDIT_SIGNING_KEY to a secret of your own (ed25519:<urlsafe base64 of 32 random "
            "bytes>, or any other string for HMAC)")


def signer_from_key(key: str) -> Signer:
    if key.startswith("ed25519:"):
        return Ed25519Signer(base64.urlsafe_b64decode(key[len("ed25519:"):]))
    return HmacSigner(key.encode())
