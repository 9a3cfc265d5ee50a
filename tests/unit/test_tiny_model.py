import hashlib
import json
from pathlib import Path

import pytest

from workers.tiny_model import MARKER, is_complete, main, make_tiny_model


def _digests(directory: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("a") / "tiny", seed=0)


def test_same_seed_gives_identical_files(tiny, tmp_path):
    again = make_tiny_model(tmp_path / "tiny", seed=0)
    assert _digests(again) == _digests(tiny)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", MARKER} <= set(_digests(tiny))


def test_different_seed_gives_different_weights_same_tokenizer(tiny, tmp_path):
    other = _digests(make_tiny_model(tmp_path / "tiny", seed=1))
    assert other["model.safetensors"] != _digests(tiny)["model.safetensors"]
    assert other["tokenizer.json"] == _digests(tiny)["tokenizer.json"]


def test_complete_directory_is_not_rewritten(tiny):
    before = {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()}
    make_tiny_model(tiny, seed=0)
    assert {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()} == before


def test_damaged_directory_is_regenerated(tiny, tmp_path):
    target = make_tiny_model(tmp_path / "tiny", seed=0)
    (target / "model.safetensors").write_bytes(b"truncated")
    assert not is_complete(target, seed=0)
    make_tiny_model(target, seed=0)
    assert _digests(target) == _digests(tiny)
    assert not is_complete(target, seed=7)


def test_config_shape_fits_vllm_cpu(tiny):
    config = json.loads((tiny / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["hidden_size"] == 128 and config["num_hidden_layers"] == 2
    assert config["head_dim"] == 64 and config["num_key_value_heads"] == 1
    assert 2000 <= config["vocab_size"] <= 4096


def test_tokenizer_round_trips_text_and_adds_bos(tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    text = "The clerk keeps the books; the auditor reads them. Ünïcødé 🚀 and 12345!"
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert len(tokenizer) == json.loads((tiny / "config.json").read_text())["vocab_size"]
    # Trained on English: common words are single tokens.
    assert len(tokenizer("the ledger", add_special_tokens=False).input_ids) == 2


def test_chat_template_renders_messages(tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "<s>user: hi\nassistant:"


def test_cli_hook_prints_directory(tmp_path, capsys):
    assert main([str(tmp_path / "m"), "--seed", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    assert is_complete(tmp_path / "m", seed=3)
