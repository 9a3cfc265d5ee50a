"""`prepare_smollm2`'s bookkeeping, with the conversion replaced by a fake that writes two
small files: prepared once per source, replaced when the source or a file changes, and
never left half-written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers import small_model
from workers.small_model import MARKER, SmallModelUnavailable, find_gguf, is_prepared, prepare_smollm2


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """Each conversion's source, in order; the fake writes what the real one would name."""
    calls: list[Path] = []

    def convert(gguf: Path, out: Path) -> None:
        calls.append(gguf)
        (out / "config.json").write_text(json.dumps({"source": gguf.read_text()}))
        (out / "model.safetensors").write_bytes(b"w" * 64)
    monkeypatch.setattr(small_model, "_convert", convert)
    return calls


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "pkg" / "Model.Q4_1.gguf"
    path.parent.mkdir()
    path.write_text("weights v1")
    return path


def leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name != name)


def test_prepared_once_then_left_as_it_is(tmp_path, source, conversions):
    target = tmp_path / "models" / "small"
    assert prepare_smollm2(target, source=source) == target
    marker = json.loads((target / MARKER).read_text())
    assert marker["source"]["sha256"] == small_model.file_sha256(source)
    assert set(marker["files"]) == {"config.json", "model.safetensors"}
    mtimes = {p.name: p.stat().st_mtime_ns for p in target.iterdir()}

    assert prepare_smollm2(target, source=source) == target
    assert len(conversions) == 1
    assert {p.name: p.stat().st_mtime_ns for p in target.iterdir()} == mtimes
    assert leftovers(target.parent, "small") == []  # no staging directory stays behind


def test_a_new_source_is_prepared_again(tmp_path, source, conversions):
    target = prepare_smollm2(tmp_path / "small", source=source)
    source.write_text("weights v2")
    prepare_smollm2(target, source=source)
    assert len(conversions) == 2
    assert json.loads((target / "config.json").read_text()) == {"source": "weights v2"}
    assert is_prepared(target, small_model.file_sha256(source))
    assert leftovers(tmp_path, "small") == ["pkg"]


def test_a_damaged_directory_is_prepared_again(tmp_path, source, conversions):
    target = prepare_smollm2(tmp_path / "small", source=source)
    (target / "model.safetensors").write_bytes(b"w" * 10)  # truncated
    prepare_smollm2(target, source=source)
    assert (target / "model.safetensors").read_bytes() == b"w" * 64
    (target / "config.json").unlink()
    prepare_smollm2(target, source=source)
    assert len(conversions) == 3 and (target / "config.json").exists()


def test_a_directory_without_the_marker_is_replaced_whole(tmp_path, source, conversions):
    target = tmp_path / "small"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "stray.bin").write_bytes(b"x")
    prepare_smollm2(target, source=source)
    assert sorted(p.name for p in target.iterdir()) == sorted([MARKER, "config.json", "model.safetensors"])
    assert leftovers(tmp_path, "small") == ["pkg"]


def test_a_failed_conversion_leaves_nothing_behind(tmp_path, source, monkeypatch):
    def broken(gguf: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise RuntimeError("out of disk")
    monkeypatch.setattr(small_model, "_convert", broken)
    with pytest.raises(RuntimeError, match="out of disk"):
        prepare_smollm2(tmp_path / "small", source=source)
    assert leftovers(tmp_path, "") == ["pkg"]


def test_a_marker_from_another_recipe_does_not_count(tmp_path, source, conversions):
    target = prepare_smollm2(tmp_path / "small", source=source)
    marker = json.loads((target / MARKER).read_text())
    (target / MARKER).write_text(json.dumps({**marker, "format": small_model.FORMAT + 1}))
    assert not is_prepared(target, small_model.file_sha256(source))
    (target / MARKER).write_text("not json")
    assert not is_prepared(target, small_model.file_sha256(source))


def test_a_missing_package_is_a_clear_error():
    with pytest.raises(SmallModelUnavailable, match="not installed"):
        find_gguf("ledgerlm-no-such-package")
