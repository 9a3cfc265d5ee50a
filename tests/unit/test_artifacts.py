"""A revision's files: digested at approval, signed by a trusted key where one is given,
and checked again before a worker serves them."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from models.settings import Settings
from pipelines.bootstrap import topic_specs
from pipelines import artifacts
from pipelines.admin import commands as admin
from pipelines.admin.commands import AdminConflict, AdminError, RegistryView
from pipelines.signing import Ed25519Signer
from pipelines.eventlog.embedded import EmbeddedEventLog
from workers.revision import check_artifacts

SEED = bytes(range(32))
KEY = "ed25519:" + base64.urlsafe_b64encode(SEED).decode()
PUBLIC = Ed25519Signer(SEED).public_base64()


@pytest.fixture
def model(tmp_path):
    root = tmp_path / "model"
    (root / "tok").mkdir(parents=True)
    (root / "model.safetensors").write_bytes(b"\x00weights" * 1000)
    (root / "config.json").write_text('{"layers": 2}')
    (root / "tok" / "tokenizer.json").write_text('{"vocab": {}}')
    (root / ".cache").mkdir()
    (root / ".cache" / "lock").write_text("tools keep these")
    return root


@pytest.fixture
def view(tmp_path):
    log = EmbeddedEventLog(tmp_path / "log.db")
    log.ensure_topics(topic_specs())
    v = RegistryView(log)
    yield v
    v.close()
    log.close()


def approve(view, model, **extra):
    return admin.approve_model(view, alias="m", model_revision="m@1", model_path=str(model), engine_config_hash="h",
                               max_model_len=64, actor="ops", **extra)


def served(view, model, **settings):
    check_artifacts(Settings(**settings), view.refresh().revisions["m@1"])


def test_every_file_is_digested_hidden_ones_left_out_and_the_manifest_follows_the_bytes(model):
    digests = artifacts.artifact_digests(model)
    assert sorted(digests) == ["config.json", "model.safetensors", "tok/tokenizer.json"]
    before = artifacts.manifest_digest(digests)
    (model / "config.json").write_text('{"layers": 3}')
    assert artifacts.manifest_digest(artifacts.artifact_digests(model)) != before
    with pytest.raises(artifacts.ArtifactError, match="does not exist"):
        artifacts.artifact_digests(model / "nowhere")


@pytest.mark.parametrize("tamper, said", [
    (lambda m: (m / "model.safetensors").write_bytes(b"\x01weights" * 1000), "model.safetensors changed"),
    (lambda m: (m / "tok" / "tokenizer.json").unlink(), "tok/tokenizer.json is missing"),
    (lambda m: (m / "extra.bin").write_bytes(b"x"), "extra.bin was not there"),
])
def test_a_worker_refuses_a_directory_whose_files_are_not_the_approved_ones(view, model, tamper, said):
    approve(view, model, artifact_digests=artifacts.artifact_digests(model))
    served(view, model)  # as approved: served
    (model / ".cache" / "lock").write_text("a tool's own file changes nothing")
    served(view, model)
    tamper(model)
    with pytest.raises(artifacts.ArtifactError, match=said):
        served(view, model)


def test_a_signature_from_a_trusted_key_is_recorded_and_checked_again_when_served(view, model):
    digests = artifacts.artifact_digests(model)
    signature, key_id = artifacts.sign_manifest(artifacts.manifest_digest(digests), KEY)
    trusted = artifacts.trusted_verifiers(PUBLIC)
    approve(view, model, artifact_digests=digests, artifact_signature=signature, trusted=trusted, require_signed=True)
    revision = view.refresh().revisions["m@1"]
    assert revision.artifact_signer == key_id and artifacts.describe(revision)["artifacts"] == {
        "files": 3, "manifest": artifacts.manifest_digest(digests), "signed_by": key_id}
    served(view, model, artifact_trusted_keys=PUBLIC, require_signed_artifacts=True)
    other = Ed25519Signer(bytes(32)).public_base64()
    with pytest.raises(artifacts.ArtifactError, match="does not verify"):
        served(view, model, artifact_trusted_keys=other)


def test_approval_refuses_a_bad_or_missing_signature_and_other_files_under_a_known_name(view, model):
    digests = artifacts.artifact_digests(model)
    trusted = artifacts.trusted_verifiers(PUBLIC)
    forged = Ed25519Signer(bytes(32)).sign(artifacts.manifest_message(artifacts.manifest_digest(digests)))
    for extra, said in ((dict(artifact_digests=digests, artifact_signature=forged, trusted=trusted), "does not verify"),
                        (dict(artifact_digests=digests, artifact_signature=forged), "no key is trusted"),
                        (dict(artifact_signature=forged, trusted=trusted), "give them too"),
                        (dict(artifact_digests=digests, trusted=trusted, require_signed=True), "signed artifacts only")):
        with pytest.raises(AdminError, match=said):
            approve(view, model, **extra)
    assert "m@1" not in view.refresh().revisions, "nothing half-written"

    approve(view, model, artifact_digests=digests)
    (model / "config.json").write_text('{"layers": 9}')
    with pytest.raises(AdminConflict, match="config.json changed"):
        approve(view, model, artifact_digests=artifacts.artifact_digests(model))
    with pytest.raises(artifacts.ArtifactError, match="signed artifacts only"):
        served(view, model, require_signed_artifacts=True)


def test_a_revision_approved_without_digests_is_served_unchecked_unless_only_signed_ones_are(view, model):
    approve(view, model)
    (model / "model.safetensors").write_bytes(b"anything")
    served(view, model)
    with pytest.raises(artifacts.ArtifactError, match="without artifact digests"):
        served(view, model, require_signed_artifacts=True)


def test_model_keygen_and_sign_print_what_approval_takes(model):
    def cli(*argv):
        done = subprocess.run([sys.executable, "-m", "workers", "model", *argv], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    key = cli("keygen")
    signed = cli("sign", str(model), "--key", key["signing_key"])
    assert signed["artifact_digests"] == artifacts.artifact_digests(model) and signed["files"] == 3
    assert signed["key_id"] == key["key_id"]
    trusted = artifacts.trusted_verifiers(key["public_key"])
    assert artifacts.signer_of(signed["manifest"], signed["signature"], trusted) == key["key_id"]
    assert "signature" not in cli("sign", str(model))


def test_model_approve_digests_the_configured_model_and_serve_worker_refuses_it_once_changed(tmp_path, model):
    env = {**os.environ, "LEDGERLM_HOME": str(tmp_path / "home"), "LEDGERLM_MODEL": str(model),
           "LEDGERLM_ENGINE_FACTORY": "tests.slow_engine:SlowEngine.from_settings", "LEDGERLM_CPUS": "all"}

    def workers(*argv):
        return subprocess.run([sys.executable, "-m", "workers", *argv], capture_output=True, text=True, env=env,
                              timeout=120)

    approved = workers("model", "approve", "--alias", "m")
    assert approved.returncode == 0, approved.stderr
    revision = json.loads(approved.stdout)["model_revision"]
    (model / "model.safetensors").write_bytes(b"other weights")
    refused = workers("serve", "worker", "--revision", revision)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "model.safetensors changed" in refused.stderr and "approve them as a new revision" in refused.stderr


def test_a_batch_worker_refuses_an_approved_revision_whose_files_changed(model):
    from workers.batch_engine import EngineSlot
    from workers.engine import EngineMismatch
    from workers.vllm_engine import VllmEngineConfig, engine_config_hash

    class Engine:
        def close(self):
            pass

    made = []
    slot = EngineSlot({}, factory=lambda config: made.append(config) or Engine())
    pinned = engine_config_hash(VllmEngineConfig(model=model, max_model_len=64))
    manifest = artifacts.manifest_digest(artifacts.artifact_digests(model))
    slot.get(model_path=str(model), max_model_len=64, pinned_hash=pinned, artifact_manifest=manifest)
    assert len(made) == 1
    # The config hash samples the top-level files (large ones at both ends); the digests
    # cover every byte of every file, a subdirectory's too.
    (model / "tok" / "tokenizer.json").write_text('{"vocab": {"x": 1}}')
    assert engine_config_hash(VllmEngineConfig(model=model, max_model_len=64)) == pinned
    slot.drop()
    with pytest.raises(EngineMismatch, match="not the ones the revision was approved with"):
        slot.get(model_path=str(model), max_model_len=64, pinned_hash=pinned, artifact_manifest=manifest)
    assert len(made) == 1, "no engine started on the changed files"
