"""A fresh platform home and a stand-in model directory for tests of `model approve` and what
reads its revisions (no engine loads the model)."""
from __future__ import annotations

from pathlib import Path

# Settings a developer's shell may carry that would point approval elsewhere.
APPROVAL_ENV = ("LEDGERLM_EVENT_LOG_URL", "LEDGERLM_EVENT_LOG_NAMESPACE", "LEDGERLM_MODEL_ALIAS",
                "LEDGERLM_REQUIRE_SIGNED_ARTIFACTS", "LEDGERLM_ARTIFACT_TRUSTED_KEYS")


def fresh_home(tmp_path: Path, monkeypatch, *also_unset: str) -> Path:
    """LEDGERLM_HOME under `tmp_path`, with `APPROVAL_ENV` and `also_unset` removed."""
    for name in (*APPROVAL_ENV, *also_unset):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LEDGERLM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def stand_in_model(tmp_path: Path, monkeypatch) -> Path:
    """A directory the engine port hashes as a model, named by LEDGERLM_MODEL."""
    root = tmp_path / "smollm2"
    root.mkdir()
    (root / "config.json").write_text('{"layers": 2}')
    (root / "model.safetensors").write_bytes(b"\x00weights" * 100)
    monkeypatch.setenv("LEDGERLM_MODEL", str(root))
    return root


def registry_now():
    """The registry as the log under the current settings holds it now."""
    from models.settings import Settings
    from pipelines.bootstrap import Bootstrap

    platform = Bootstrap(Settings())
    with platform.event_log() as log:
        view = platform.registry_view(log)
        try:
            return view.refresh()
        finally:
            view.close()
