"""Log probabilities: how each route asks for them and what it refuses (a 400 naming the
field, before anything is reserved), the event bytes of requests that ask and those that
do not, the stream writer carrying them, the worker refusing an engine that gives none,
and OpenAI's shapes for chat and completions, whole and streamed."""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future

import pytest

from api.errors import ApiError
from api.openai_format import OpenAIShape
from api.sampling import sampling_of
from api.stream_hub import StreamEvent
from models import topics
from models.events import encode, new_event
from models.events_generation import (
    GenerationCompleted, GenerationFailed, GenerationQueued, Sampling, Timings, TokenLogprob, TokensEmitted,
    TopLogprob,
)
from models.sampling_request import SamplingFields
from pipelines.batch.lines import LineError, parse_line
from pipelines.cache.semantic import cacheable
from tests.fake_engine import FakeEngine
from tests.unit.test_serve_generation import Cancels, queued
from tests.unit.test_stream_writer import RecordingLog, started
from workers import engine as port
from workers.generation import serve_generation
from workers.stream_writer import StreamWriter
from workers.synthetic_engine import SyntheticEngine
from workers.vllm_engine import split_text


def asked(route, **body) -> int | None:
    return asyncio.run(sampling_of(SamplingFields.model_validate(body), route=route)).logprobs


def refused(route, **body) -> ApiError:
    with pytest.raises(ApiError) as caught:
        asked(route, **body)
    assert caught.value.status == 400
    return caught.value


def test_chat_asks_with_a_boolean_and_top_logprobs_says_how_many_alternatives():
    assert asked("chat", logprobs=True, top_logprobs=3) == 3
    assert asked("chat", logprobs=True) == 0
    assert asked("chat", logprobs=False) is None
    assert asked("chat") is None
    assert asked("chat", logprobs=True, top_logprobs=20) == 20


@pytest.mark.parametrize("body,param", [
    ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": False, "top_logprobs": 0}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"logprobs": 2}, "logprobs"),
])
def test_chat_refuses_naming_the_field(body, param):
    assert refused("chat", **body).param == param


def test_completions_ask_with_a_number_from_0_to_5():
    assert [asked("text", logprobs=k) for k in (0, 2, 5)] == [0, 2, 5]
    assert asked("text") is None
    for body, param in [({"logprobs": 6}, "logprobs"), ({"logprobs": -1}, "logprobs"), ({"logprobs": True}, "logprobs"),
                        ({"logprobs": 1, "top_logprobs": 1}, "top_logprobs")]:
        assert refused("text", **body).param == param


def test_a_body_that_does_not_ask_dumps_as_before_them_so_its_idempotency_hash_holds():
    assert "logprobs" not in SamplingFields().model_dump() and "top_logprobs" not in SamplingFields().model_dump()
    assert SamplingFields(logprobs=False).model_dump()["logprobs"] is False


def test_a_route_without_log_probabilities_refuses_them_even_at_0():
    for body, param in [({"logprobs": 0}, "logprobs"), ({"logprobs": True}, "logprobs"),
                        ({"top_logprobs": 0}, "top_logprobs")]:
        error = refused(None, **body)
        assert (error.code, error.param) == ("unsupported_parameter", param)
    assert asked(None, logprobs=False) is None


@pytest.mark.parametrize("body,field", [({"logprobs": True}, "logprobs"), ({"logprobs": 0}, "logprobs"),
                                        ({"top_logprobs": 2}, "top_logprobs")])
def test_a_batch_line_asking_for_log_probabilities_is_refused_naming_the_field(body, field):
    line = json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/completions",
                       "body": {"model": "tiny", "prompt": "x", **body}}).encode()
    with pytest.raises(LineError) as raised:
        parse_line(line, 1, "/v1/completions")
    assert f"body.{field} is not supported" in raised.value.message


def test_requests_and_token_events_that_ask_for_nothing_keep_their_bytes():
    assert "logprobs" not in Sampling().model_dump_json()
    assert Sampling(logprobs=0).model_dump()["logprobs"] == 0
    plain = TokensEmitted(request_id="r", seq=0, text="a", token_count=1)
    assert "logprobs" not in plain.model_dump_json()
    env = new_event(plain, tenant_id="t", correlation_id="r")
    assert b"logprob" not in encode(env)


def _tokens(*pairs) -> tuple[TokenLogprob, ...]:
    other = TopLogprob(token="é", logprob=-3.0)
    return tuple(TokenLogprob(token=t, logprob=lp, top=(TopLogprob(token=t, logprob=lp), other)) for t, lp in pairs)


def _event(payload, offset: int = 1) -> StreamEvent:
    return StreamEvent(offset, new_event(payload, tenant_id="t", correlation_id="r"))


def _chunks(shape: OpenAIShape, payload) -> list[dict]:
    return [json.loads(c.decode().split("data: ", 1)[1]) for c in shape.chunks(_event(payload))]


def _end() -> GenerationCompleted:
    return GenerationCompleted(request_id="r", finish_reason="length", input_tokens=1, output_tokens=3,
                               model_revision="m@1", output_sha256="x", timings=Timings())


def test_chat_chunks_and_answer_carry_each_tokens_logprob_bytes_and_alternatives():
    shape = OpenAIShape("chat", "r", "m", 0, logprobs=True)
    [chunk] = _chunks(shape, TokensEmitted(request_id="r", seq=0, text="Hi é", token_count=2,
                                           logprobs=_tokens(("Hi", -0.5), (" é", -1.5))))
    content = chunk["choices"][0]["logprobs"]["content"]
    assert content[1] == {"token": " é", "logprob": -1.5, "bytes": [32, 195, 169],
                          "top_logprobs": [{"token": " é", "logprob": -1.5, "bytes": [32, 195, 169]},
                                           {"token": "é", "logprob": -3.0, "bytes": [195, 169]}]}
    whole = shape.response("Hi é", _end(), list(_tokens(("Hi", -0.5), (" é", -1.5))))
    assert [t["token"] for t in whole["choices"][0]["logprobs"]["content"]] == ["Hi", " é"]


def test_completion_chunks_count_text_offsets_across_chunks_and_the_answer_lists_alternatives_as_dicts():
    shape = OpenAIShape("text", "r", "m", 0, logprobs=True)
    first = _chunks(shape, TokensEmitted(request_id="r", seq=0, text="ab", token_count=2,
                                         logprobs=_tokens(("a", -0.1), ("b", -0.2))))
    second = _chunks(shape, TokensEmitted(request_id="r", seq=1, text="cd", token_count=1,
                                          logprobs=_tokens(("cd", -0.3))))
    assert first[0]["choices"][0]["logprobs"]["text_offset"] == [0, 1]
    assert second[0]["choices"][0]["logprobs"] == {"tokens": ["cd"], "token_logprobs": [-0.3],
                                                   "top_logprobs": [{"cd": -0.3, "é": -3.0}], "text_offset": [2]}
    whole = OpenAIShape("text", "r", "m", 0, logprobs=True).response(
        "abcd", _end(), list(_tokens(("a", -0.1), ("b", -0.2), ("cd", -0.3))))
    assert whole["choices"][0]["logprobs"]["tokens"] == ["a", "b", "cd"]
    assert whole["choices"][0]["logprobs"]["text_offset"] == [0, 1, 2]


def test_a_request_that_did_not_ask_gets_null_logprobs():
    for kind in ("chat", "text"):
        shape = OpenAIShape(kind, "r", "m", 0)
        [chunk] = _chunks(shape, TokensEmitted(request_id="r", seq=0, text="a", token_count=1))
        assert chunk["choices"][0]["logprobs"] is None
        assert shape.response("a", _end())["choices"][0]["logprobs"] is None


def test_the_stream_writer_puts_logprobs_only_on_the_events_of_requests_that_asked():
    async def run() -> list:
        log = RecordingLog()
        writer = StreamWriter(log)
        with_lp, without = started("lp"), started("plain")
        writer.tokens(with_lp, "tok ", 1, (port.TokenLogprob("tok ", -0.25, (("tok ", -0.25), ("alt1 ", -1.25))),))
        writer.tokens(without, "x", 1)
        await writer.drain(with_lp)
        await writer.drain(without)
        return [e.payload for e in log.on(topics.STREAM) if isinstance(e.payload, TokensEmitted)]
    by_id = {p.request_id: p for p in asyncio.run(run())}
    assert by_id["plain"].logprobs is None
    assert by_id["lp"].logprobs == (TokenLogprob(token="tok ", logprob=-0.25, top=(
        TopLogprob(token="tok ", logprob=-0.25), TopLogprob(token="alt1 ", logprob=-1.25))),)


def test_the_synthetic_engine_gives_made_up_logprobs_only_when_asked():
    async def run(logprobs):
        engine = SyntheticEngine(tokens_per_s=1000.0)
        req = port.EngineRequest("r", "p", 2, "t", logprobs=logprobs)
        try:
            return [d async for d in engine.generate(req)]
        finally:
            engine.close()
    assert [d.logprobs for d in asyncio.run(run(None))] == [None, None]
    deltas = asyncio.run(run(2))
    assert [len(d.logprobs[0].top) for d in deltas] == [2, 2]
    assert all(d.logprobs[0].logprob <= 0 for d in deltas)


def test_a_request_asking_for_logprobs_is_never_answered_from_the_semantic_cache():
    assert cacheable(Sampling(temperature=0).model_dump())
    assert not cacheable(Sampling(temperature=0, logprobs=0).model_dump(), sampled_too=True)


def test_the_base_engine_gives_none():
    assert port.InferenceEngine.max_logprobs(object()) is None


def _serve(engine, logprobs: int | None) -> list:
    env = queued("r")
    req = env.payload.request.model_copy(update={"sampling": Sampling(logprobs=logprobs), "max_output_tokens": 2})
    env = env.model_copy(update={"payload": GenerationQueued(**{**dict(env.payload), "request": req})})
    log = RecordingLog()

    async def main() -> None:
        prompt, taken = Future(), Future()
        prompt.set_result("p")
        taken.set_result(True)
        await asyncio.wait_for(serve_generation(engine, Cancels(), env, started("r"), StreamWriter(log), prompt,
                                                taken), timeout=30)
    asyncio.run(main())
    return [e.payload for e in log.on(topics.STREAM)]


def test_the_worker_fails_a_request_asking_for_logprobs_of_an_engine_that_gives_none_without_running_it():
    engine = FakeEngine(hold=False)
    stream = _serve(engine, 1)
    assert engine.started == [] and isinstance(stream[-1], GenerationFailed)
    assert not any(isinstance(p, TokensEmitted) for p in stream)


def test_the_worker_puts_the_engines_logprobs_on_the_token_events_of_a_request_that_asked():
    engine = SyntheticEngine(tokens_per_s=1000.0)
    try:
        tokens = [p for p in _serve(engine, 2) if isinstance(p, TokensEmitted)]
        plain = [p for p in _serve(engine, None) if isinstance(p, TokensEmitted)]
    finally:
        engine.close()
    assert sum(len(p.logprobs) for p in tokens) == sum(p.token_count for p in tokens) == 2
    assert all(len(t.top) == 2 for p in tokens for t in p.logprobs)
    assert plain and all(p.logprobs is None for p in plain)


@pytest.mark.parametrize("text,decoded,pieces", [
    ("Hello world", ["Hello", "world"], ["Hello", " world"]),  # a tokenizer's space mark, lost decoding alone
    (" a b", ["a", "b"], [" a", " b"]),
    ("é!", ["\ufffd", "\ufffd", "!"], ["", "", "é!"]),  # a character across tokens: the text comes whole
    ("cut", ["cu", "tting"], ["cu", "t"]),  # a stop string cut the last token short
    ("x", ["x"], ["x"]), ("", [], []),
])
def test_a_deltas_text_is_cut_into_one_piece_a_token_that_join_to_it(text, decoded, pieces):
    assert split_text(text, decoded) == pieces
    assert "".join(split_text(text, decoded)) == text
