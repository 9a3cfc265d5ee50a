"""The official `openai` client, unchanged, against ledgerlm: chat completions and
completions, streamed and not, with usage; its errors arrive as its own exceptions."""
from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until
from tests.conftest import platform_both_ways

platform = platform_both_ways()  # each test also runs with admission in the worker

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]


def openai_client(platform, secret: str) -> OpenAI:
    return OpenAI(base_url=platform.base_url + "/v1", api_key=secret, max_retries=0, timeout=120)


def test_chat_completion_returns_the_message_and_usage(platform):
    _, secret = platform.tenant()
    client = openai_client(platform, secret)
    completion = client.chat.completions.create(model=MODEL_ALIAS, messages=MESSAGES, max_tokens=8,
                                                extra_body={"ignore_eos": True})
    assert completion.object == "chat.completion"
    assert completion.model == MODEL_ALIAS
    assert completion.system_fingerprint == platform.model_revision
    [choice] = completion.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    usage = completion.usage
    assert usage.completion_tokens == 8 and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    # Its id is a generation of this tenant, with the same usage once settled.
    with platform.client(secret) as http:
        def settled():
            status = http.get(f"/v1/generations/{completion.id}").json()
            return status if status["usage"]["settled"] else None

        status = wait_until(settled, 30, what="the completion to settle")
    assert status["status"] == "completed"
    assert status["usage"]["input_tokens"] == usage.prompt_tokens
    assert status["usage"]["output_tokens"] == 8


def test_streamed_chat_completion_with_include_usage(platform):
    _, secret = platform.tenant()
    client = openai_client(platform, secret)
    chunks = list(client.chat.completions.create(
        model=MODEL_ALIAS, messages=MESSAGES, max_tokens=10, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}))
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    with_choices = [c for c in chunks if c.choices]
    assert [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason] == ["length"]
    assert all(c.usage is None for c in with_choices), "usage is null on every chunk but the last"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 10 and last.usage.prompt_tokens > 0
    assert "".join(c.choices[0].delta.content or "" for c in with_choices)


def test_streamed_chat_without_include_usage_sends_no_usage(platform):
    _, secret = platform.tenant()
    chunks = list(openai_client(platform, secret).chat.completions.create(
        model=MODEL_ALIAS, messages=MESSAGES, max_tokens=4, stream=True, extra_body={"ignore_eos": True}))
    assert all(c.choices for c in chunks)
    assert all(getattr(c, "usage", None) is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completions_streamed_and_not_give_the_same_greedy_text(platform):
    _, secret = platform.tenant()
    client = openai_client(platform, secret)
    whole = client.completions.create(model=MODEL_ALIAS, prompt="Once upon a time", max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert whole.object == "text_completion"
    assert whole.usage.completion_tokens == 6 and whole.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(model=MODEL_ALIAS, prompt="Once upon a time", max_tokens=6,
                                            temperature=0, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == 6


def test_errors_reach_the_client_as_its_own_exceptions(platform):
    _, secret = platform.tenant()
    client = openai_client(platform, secret)
    served_before = platform.worker.served
    with pytest.raises(openai.AuthenticationError):
        openai_client(platform, "not-a-key").chat.completions.create(model=MODEL_ALIAS, messages=MESSAGES)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(model=MODEL_ALIAS, messages=MESSAGES, max_tokens=1_000_000)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_ALIAS, messages=MESSAGES, n=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_ALIAS, prompt="x", max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.chat.completions.create(model=MODEL_ALIAS, messages=MESSAGES, logit_bias={"1": 5})
    assert platform.worker.served == served_before
