"""`ledgerlm model approve` (`python -m workers model approve`) in-process: a second revision
of a model under a name of its own, its prices, and a bad LEDGERLM_MODEL said in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import workers.__main__ as workers_cli
from models.prices import PRICE_FLAGS
from tests.model_dirs import fresh_home, registry_now, stand_in_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path, monkeypatch):
    return fresh_home(tmp_path, monkeypatch)


@pytest.fixture
def model(tmp_path, monkeypatch):
    """A directory the engine port hashes as a model (no engine loads it here)."""
    return stand_in_model(tmp_path, monkeypatch)


def approve(capsys, *argv: str) -> tuple[int, list[dict], str]:
    code = workers_cli.main(["model", "approve", *argv])
    out = capsys.readouterr()
    return code, [json.loads(line) for line in out.out.splitlines()], out.err


def registry():
    return registry_now()


def test_model_approve_names_a_second_revision_and_sets_its_prices(home, model, capsys):
    code, [first], err = approve(capsys, "--alias", "smollm2")
    assert code == 0, err
    assert first["model_revision"].startswith("smollm2@")  # the default name: directory @ config hash
    code, [second], err = approve(capsys, "--alias", "smollm2-next", "--revision", "smollm2@v2",
                                  "--price-input-per-1k-micros", "150", "--price-output-per-1k-micros", "600")
    assert code == 0, err
    assert second == {"model_revision": "smollm2@v2"}

    seen = registry()
    assert set(seen.revisions) == {first["model_revision"], "smollm2@v2"}
    v2 = seen.revisions["smollm2@v2"]
    assert (v2.price_input_per_1k_micros, v2.price_output_per_1k_micros) == (150, 600)
    assert v2.model_path == str(model.resolve()) and v2.artifact_digests is not None
    v1 = seen.revisions[first["model_revision"]]
    assert (v1.price_input_per_1k_micros, v1.price_output_per_1k_micros) == (0, 0)
    assert seen.aliases["smollm2"].model_revision == first["model_revision"]
    assert seen.aliases["smollm2-next"].model_revision == "smollm2@v2"


@pytest.mark.parametrize(("price", "why"), [("-1", "not negative"), ("1.5", "whole number"), ("lots", "whole number")])
def test_a_price_that_is_no_whole_non_negative_number_is_refused_before_anything_is_approved(home, model, capsys,
                                                                                              price, why):
    with pytest.raises(SystemExit) as exited:
        workers_cli.main(["model", "approve", "--price-input-per-1k-micros", price])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--price-input-per-1k-micros" in err and why in err, err
    assert registry().revisions == {}


def test_model_approve_takes_the_price_flags_of_admin_model_approve():
    import argparse

    from api.cli.main import build_parser

    def approve_flags(parser: argparse.ArgumentParser, *path: str) -> set[str]:
        for name in path:
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
            parser = sub.choices[name]
        return {flag for action in parser._actions for flag in action.option_strings}  # noqa: SLF001

    admin = approve_flags(build_parser(), "admin", "model", "approve")
    ours = approve_flags(workers_cli._parser(), "model", "approve")  # noqa: SLF001
    prices = {flag for flag in admin if "price" in flag}
    assert prices == set(PRICE_FLAGS) and prices <= ours
    assert {"--alias", "--revision", "--signature"} <= ours


def _bad_models(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    plain_file = tmp_path / "weights.bin"
    plain_file.write_bytes(b"x")
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    (no_config / "model.safetensors").write_bytes(b"x")
    return {"missing": (tmp_path / "nowhere", "no such directory"),
            "file": (plain_file, "not a directory"),
            "no-config": (no_config, "no config.json")}


@pytest.mark.parametrize("case", ["missing", "file", "no-config"])
def test_a_bad_model_path_is_one_line_naming_it_and_exit_status_2(home, tmp_path, monkeypatch, capsys, case):
    path, why = _bad_models(tmp_path)[case]
    monkeypatch.setenv("LEDGERLM_MODEL", str(path))
    code, out, err = approve(capsys)
    assert code == 2 and out == []
    assert err.count("\n") == 1 and str(path) in err and why in err, err
    assert err.startswith("ledgerlm model approve: ")
    assert registry().revisions == {}


def test_serve_worker_on_a_bad_model_path_says_so_in_one_line(tmp_path):
    path, why = _bad_models(tmp_path)["no-config"]
    env = {**os.environ, "LEDGERLM_HOME": str(tmp_path / "home"), "LEDGERLM_MODEL": str(path),
           "LEDGERLM_EVENT_LOG_URL": "", "LEDGERLM_EVENT_LOG_NAMESPACE": "", "LEDGERLM_CPUS": "all",
           "LEDGERLM_METRICS_PORT": "0"}
    done = subprocess.run([sys.executable, "-m", "api.cli", "serve", "worker"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and str(path) in done.stderr and why in done.stderr, done.stderr
    assert done.stderr.startswith("ledgerlm serve worker: ")
