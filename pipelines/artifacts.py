"""What a revision's model directory held when it was approved: a SHA-256 of every file
(weights, tokenizer, configuration), and optionally a signature over them.

The engine config hash says how a directory is run; these digests say which bytes it
holds. A revision approved with digests is served only from a directory whose files
still match them, so weights swapped in place under an approved name are refused before
an engine loads them. The digests of a directory are one manifest digest (SHA-256 of the
sorted file list); a signer signs `manifest_message(manifest)` with an Ed25519 key, and
the platform trusts the public keys its settings name (`artifact_trusted_keys`).

Hidden entries (a leading '.') are left out: tools keep caches and locks there.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from models.events import canonical
from pipelines.signing import Ed25519Signer, Ed25519Verifier, signer_from_key

_CHUNK = 1 << 20


class ArtifactError(ValueError):
    """A model directory that cannot be approved or served as it stands."""


def _files(root: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith("."):
                yield Path(dirpath) / name


def file_digest(path: Path) -> str:
    """Read in full every time: a size and mtime kept as they were prove nothing."""
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def artifact_digests(model_dir: Path) -> dict[str, str]:
    """{path relative to the directory ('/'-separated): sha256 hex} for every file in it."""
    root = Path(model_dir)
    if not root.is_dir():
        raise ArtifactError(f"model directory {root} does not exist or is not a directory")
    found = {p.relative_to(root).as_posix(): file_digest(p) for p in _files(root)}
    if not found:
        raise ArtifactError(f"model directory {root} holds no files")
    return found


def manifest_digest(digests: dict[str, str]) -> str:
    return hashlib.sha256(canonical({"v": 1, "files": digests})).hexdigest()


def manifest_message(manifest: str) -> bytes:
    """The bytes an artifact signature signs."""
    return canonical({"v": 1, "kind": "ledgerlm-model-artifacts", "manifest": manifest})


def differences(approved: dict[str, str], actual: dict[str, str]) -> list[str]:
    """What changed between two digest sets, one phrase per file, sorted by path."""
    out = []
    for name in sorted(set(approved) | set(actual)):
        if name not in actual:
            out.append(f"{name} is missing")
        elif name not in approved:
            out.append(f"{name} was not there")
        elif approved[name] != actual[name]:
            out.append(f"{name} changed")
    return out


def trusted_verifiers(keys: str | None) -> list:
    """Ed25519 verifiers for a comma-separated list of urlsafe-base64 public keys."""
    verifiers = []
    for text in (keys or "").split(","):
        text = text.strip().removeprefix("ed25519:")
        if not text:
            continue
        try:
            verifiers.append(Ed25519Verifier.from_base64(text))
        except ValueError as exc:
            raise ArtifactError(f"artifact_trusted_keys: {text[:16]}... is not an Ed25519 public key ({exc})") from None
    return verifiers


def approval_policy(settings) -> dict:
    """The keyword arguments `pipelines.admin.commands.approve_model` takes from the settings."""
    return {"trusted": trusted_verifiers(settings.artifact_trusted_keys),
            "require_signed": settings.require_signed_artifacts}


def describe(revision) -> dict:
    """What a revision's record says of its files, for status lines and admin answers."""
    if revision.artifact_digests is None:
        return {"artifacts": None}
    return {"artifacts": {"files": len(revision.artifact_digests),
                          "manifest": manifest_digest(revision.artifact_digests),
                          "signed_by": revision.artifact_signer}}


def signer_of(manifest: str, signature: str, verifiers: list) -> str | None:
    """The key id of the trusted key the signature verifies with, or None."""
    message = manifest_message(manifest)
    for verifier in verifiers:
        if verifier.verify(message, signature):
            return verifier.key_id
    return None


def sign_manifest(manifest: str, key: str) -> tuple[str, str]:
    """(signature hex, key id) under `ed25519:<urlsafe base64 of a 32-byte seed>`."""
    signer = signer_from_key(key)
    if not isinstance(signer, Ed25519Signer):
        raise ArtifactError("an artifact signing key is ed25519:<urlsafe base64 of a 32-byte seed>")
    return signer.sign(manifest_message(manifest)), signer.key_id


def check_served(model_dir: Path, *, revision: str, approved: dict[str, str] | None, signature: str | None,
                 verifiers: list, require_signed: bool) -> None:
    """Raises `ArtifactError` unless the directory still holds what the revision was approved
    with (and, where keys are trusted, the signature over it verifies)."""
    if approved is None:
        if require_signed:
            raise ArtifactError(f"revision {revision} was approved without artifact digests, and this platform "
                                f"serves signed artifacts only (LEDGERLM_REQUIRE_SIGNED_ARTIFACTS)")
        return
    manifest = manifest_digest(approved)
    if signature is None and require_signed:
        raise ArtifactError(f"revision {revision} was approved unsigned, and this platform serves signed "
                            f"artifacts only (LEDGERLM_REQUIRE_SIGNED_ARTIFACTS)")
    if signature is not None and verifiers and signer_of(manifest, signature, verifiers) is None:
        raise ArtifactError(f"revision {revision}'s artifact signature does not verify with any trusted key")
    changed = differences(approved, artifact_digests(model_dir))
    if changed:
        shown = "; ".join(changed[:5]) + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise ArtifactError(f"the files in {model_dir} are not the ones revision {revision} was approved with "
                            f"({shown}): approve them as a new revision, or restore the approved files")
