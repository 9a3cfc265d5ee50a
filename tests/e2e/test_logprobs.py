"""Log probabilities through the whole platform on both event logs, with the unmodified
`openai` client and the tiny model on vLLM: the ask rides on the request's sampling to the
engine, each token event of that request carries its tokens' log probabilities, and the
answer has them in OpenAI's shapes, whole and streamed. A request that asks for none gets
none, and its token events carry no such field."""
from __future__ import annotations

import openai
import pytest

from models import topics
from models.events import decode
from pipelines.eventlog import partition_for
from tests.e2e.test_cancel import events_of
from tests.e2e.test_openai import openai_client
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until

MESSAGES = [{"role": "user", "content": "Count the ledgers."}]
TOKENS = 6


def token_events(platform, request_id: str) -> list:
    """The request's `TokensEmitted` as written on its stream partition, raw and decoded."""
    log = platform.admin_log
    records = log.read_partition(topics.STREAM.name, partition_for(request_id, log.partitions(topics.STREAM.name)))
    found = [(r.value, decode(r.value)) for r in records]
    return [(raw, env) for raw, env in found if env.correlation_id == request_id and env.event_type == "TokensEmitted"]


def assert_chat_logprobs(content, text: str, top: int) -> None:
    assert content, "no logprobs"
    for entry in content:
        assert entry.logprob <= 0.0
        assert len(entry.top_logprobs) == top
        assert entry.bytes == list(entry.token.encode())
    assert "".join(entry.token for entry in content) == text


def test_chat_logprobs_whole_and_streamed(platform):
    _, secret = platform.tenant()
    client = openai_client(platform, secret)
    ask = {"model": MODEL_ALIAS, "messages": MESSAGES, "max_tokens": TOKENS, "logprobs": True, "top_logprobs": 3,
           "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(**ask)
    [choice] = whole.choices
    assert_chat_logprobs(choice.logprobs.content, choice.message.content, 3)
    assert len(choice.logprobs.content) == whole.usage.completion_tokens == TOKENS

    streamed = list(client.chat.completions.create(**ask, stream=True))
    content = [entry for chunk in streamed for c in chunk.choices if c.logprobs for entry in c.logprobs.content]
    text = "".join(c.delta.content or "" for chunk in streamed for c in chunk.choices)
    assert_chat_logprobs(content, text, 3)

    # The ask rode on the request's event; its token events carry one entry a token.
    def all_tokens():
        events = token_events(platform, whole.id)
        return events if sum(env.payload.token_count for _, env in events) == TOKENS else None
    events = wait_until(all_tokens, 30, what="all the token events")
    assert sum(len(env.payload.logprobs) for _, env in events) == TOKENS


def test_completion_logprobs_whole_and_streamed(platform):
    tenant_id, secret = platform.tenant()
    client = openai_client(platform, secret)
    ask = {"model": MODEL_ALIAS, "prompt": "The ledger", "max_tokens": TOKENS, "logprobs": 2,
           "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**ask)
    [choice] = whole.choices
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == TOKENS
    assert "".join(lp.tokens) == choice.text
    assert all(x <= 0.0 for x in lp.token_logprobs) and all(len(alt) == 2 for alt in lp.top_logprobs)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(TOKENS)]
    [requested] = events_of(platform.admin_log, tenant_id, whole.id, topics.REQUESTS, "GenerationRequested")
    assert requested.payload.sampling.logprobs == 2

    streamed = list(client.completions.create(**ask, stream=True))
    tokens = [t for chunk in streamed for c in chunk.choices if c.logprobs for t in c.logprobs.tokens]
    assert "".join(tokens) == "".join(c.text for chunk in streamed for c in chunk.choices)
    assert len(tokens) == TOKENS


def test_a_request_without_logprobs_has_none_and_its_token_events_carry_none(platform):
    tenant_id, secret = platform.tenant()
    client = openai_client(platform, secret)
    completion = client.chat.completions.create(model=MODEL_ALIAS, messages=MESSAGES, max_tokens=TOKENS,
                                                extra_body={"ignore_eos": True})
    assert completion.choices[0].logprobs is None
    [requested] = events_of(platform.admin_log, tenant_id, completion.id, topics.REQUESTS, "GenerationRequested")
    assert requested.payload.sampling.logprobs is None
    events = wait_until(lambda: token_events(platform, completion.id), 30, what="the token events")
    assert all(b"logprob" not in raw and env.payload.logprobs is None for raw, env in events)


def test_logprobs_past_the_limits_are_refused_naming_the_field_before_anything_runs(platform):
    _, secret = platform.tenant()
    client = openai_client(platform, secret)
    served_before = platform.worker.served
    for ask, param in [({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"top_logprobs": 2}, "top_logprobs")]:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL_ALIAS, messages=MESSAGES, **ask)
        assert caught.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL_ALIAS, prompt="x", logprobs=6)
    assert caught.value.body["param"] == "logprobs"
    assert platform.worker.served == served_before
