"""A model without a chat template: the check on its directory, the counter and the batch
encoder refusing messages with `ChatTemplateMissing` (not transformers' bare ValueError),
a batch of chat lines to it failing validation with each line's reason, a
chat_template.jinja beside the tokenizer giving it one, and `ledgerlm model approve`
approving it with a one-line note."""
from __future__ import annotations

import json
import shutil
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

import workers.__main__ as workers_cli
from models.batch import BatchState
from pipelines.batch.validate import BatchInputError, validate_requests
from pipelines.objectstore import MemoryObjectStore
from pipelines.batch.tokens import encode_chat, encode_completion
from pipelines.generation.tokencount import ChatTemplateMissing, TokenCounter, has_chat_template
from workers.tiny_model import make_tiny_model

MESSAGES = [{"role": "user", "content": "hello"}]


def without_chat_template(source: Path, target: Path) -> Path:
    """A copy of a model directory with the chat template taken out of tokenizer_config.json."""
    shutil.copytree(source, target)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    del config["chat_template"]
    config_path.write_text(json.dumps(config))
    return target


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("chat-template") / "tiny", seed=0)


def test_the_directory_check_sees_a_template_in_the_config_or_a_jinja_file(tiny, tmp_path):
    assert has_chat_template(tiny)
    bare = without_chat_template(tiny, tmp_path / "bare")
    assert not has_chat_template(bare)
    assert not has_chat_template(tmp_path / "no-such-model")
    (bare / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert has_chat_template(bare)


def test_messages_to_a_model_without_template_raise_chat_template_missing(tiny, tmp_path):
    bare = str(without_chat_template(tiny, tmp_path / "bare"))
    counter = TokenCounter()
    with pytest.raises(ChatTemplateMissing):
        counter.chat_prompt(bare, MESSAGES)
    assert counter.count(bare, "hello") > 0, "completions still count"
    assert counter.chat_prompt(str(tiny), MESSAGES), "the model with a template still templates"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bare)
    with pytest.raises(ChatTemplateMissing):
        encode_chat(tokenizer, MESSAGES)
    assert encode_completion(tokenizer, "hello")


def test_a_chat_template_jinja_beside_the_tokenizer_is_the_template_used(tiny, tmp_path):
    bare = without_chat_template(tiny, tmp_path / "jinja")
    (bare / "chat_template.jinja").write_text(
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert TokenCounter().chat_prompt(str(bare), MESSAGES) == "<user>hello<assistant>"


def test_approve_notes_a_model_without_template_and_approves_it(tiny, tmp_path, monkeypatch, capsys):
    for name in ("LEDGERLM_EVENT_LOG_URL", "LEDGERLM_EVENT_LOG_NAMESPACE", "LEDGERLM_MODEL_ALIAS",
                 "LEDGERLM_REQUIRE_SIGNED_ARTIFACTS", "LEDGERLM_ARTIFACT_TRUSTED_KEYS", "LEDGERLM_ENGINE_FACTORY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LEDGERLM_HOME", str(tmp_path / "home"))
    bare = without_chat_template(tiny, tmp_path / "base-model")
    monkeypatch.setenv("LEDGERLM_MODEL", str(bare))
    assert workers_cli.main(["model", "approve", "--alias", "base", "--revision", "base@v1"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == {"model_revision": "base@v1"}
    assert out.err == ("ledgerlm model approve: base@v1 has no chat template: chat requests to it will be refused; "
                       "completions work\n"), out.err
    monkeypatch.setenv("LEDGERLM_MODEL", str(tiny))
    assert workers_cli.main(["model", "approve", "--alias", "tiny", "--revision", "tiny@v1"]) == 0
    assert capsys.readouterr().err == "", "a model with a template gets no note"


def test_a_chat_batch_to_a_model_without_template_fails_validation_line_by_line(tiny, tmp_path):
    bare = without_chat_template(tiny, tmp_path / "bare")
    store = MemoryObjectStore(f"memory://chat-template-{uuid.uuid4().hex[:8]}")
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "base", "messages": MESSAGES, "max_tokens": 2}} for i in range(2)]
    store.put_bytes("input.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode())
    now = datetime.now(timezone.utc)
    batch = BatchState(tenant_id="t", batch_id="batch_x", endpoint="/v1/chat/completions", input_key="input.jsonl",
                       input_file_id="f", completion_window="24h", created_at=now, expires_at=now + timedelta(days=1),
                       metadata={}, application_id="default", model_alias=None, summarization=None)
    revision = SimpleNamespace(model_path=str(bare), model_revision="base@v1", max_model_len=512)
    registry = SimpleNamespace(resolve_alias=lambda alias, tenant_id: revision if alias == "base" else None)
    with pytest.raises(BatchInputError) as refused:
        validate_requests(batch, store=store, registry=registry, chunk_size=10, max_requests=10)
    said = "model revision base@v1 has no chat template: use /v1/completions or approve a model with one"
    assert refused.value.error.code == "no_valid_requests"
    assert refused.value.error.message == f"no request can run on the model: line 1: {said}"
    assert [(e["error"]["line"], e["error"]["code"], e["error"]["message"]) for e in refused.value.invalid] == [
        (1, "chat_template_missing", f"line 1: {said}"), (2, "chat_template_missing", f"line 2: {said}")]
