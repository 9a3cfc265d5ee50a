"""Checking batch input lines, sniffing file formats, and the summarization plan."""
from __future__ import annotations

import io
import json

import pytest

from models.summarization import PlanError, Shape, groups, plan, split_even
from pipelines.batch.lines import LineError, parse_line
from pipelines.batch.submit import SNIFF_BYTES, sniff_file
from pipelines.objectstore import check_key

CHAT = "/v1/chat/completions"


def line(**overrides) -> bytes:
    data = {"custom_id": "a", "method": "POST", "url": CHAT,
            "body": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}}
    data.update(overrides)
    return json.dumps(data).encode()


def test_a_valid_chat_line_parses_with_its_sampling():
    parsed = parse_line(line(body={"model": "tiny", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_completion_tokens": 7, "temperature": 0, "stop": "\n", "seed": 3, "unknown_field": 1}), 4, CHAT)
    assert parsed.custom_id == "a" and parsed.line == 4 and parsed.max_tokens == 7
    assert parsed.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert parsed.stop == ["\n"] and parsed.temperature == 0 and parsed.seed == 3


def test_a_completion_line_takes_one_prompt():
    url = "/v1/completions"
    assert parse_line(line(url=url, body={"model": "m", "prompt": ["x"]}), 1, url).prompt == "x"
    with pytest.raises(LineError, match="exactly one prompt"):
        parse_line(line(url=url, body={"model": "m", "prompt": ["x", "y"]}), 1, url)


@pytest.mark.parametrize("raw, code", [
    (b"{not json", "invalid_json"),
    (b"[1, 2]", "invalid_request"),
    (line(custom_id=""), "invalid_request"),
    (json.dumps({"method": "POST", "url": CHAT, "body": {}}).encode(), "invalid_request"),
    (line(method="GET"), "invalid_method"),
    (line(url="/v1/embeddings"), "invalid_url"),
    (line(body={"model": "tiny"}), "invalid_request"),
    (line(body={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 2}), "invalid_request"),
    (line(body={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": True}),
     "invalid_request"),
    (line(body={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": 9}),
     "invalid_request"),
    (line(body={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "seed": 2**70}),
     "invalid_request"),
    (b'{"custom_id": "a", "deep": ' + b"[" * 10_000 + b'"\\ud800"' + b"]" * 10_000 + b"}", "invalid_json"),
])
def test_bad_lines_get_a_code_that_says_why(raw, code):
    with pytest.raises(LineError) as err:
        parse_line(raw, 2, CHAT)
    assert err.value.code == code and "line 2" in err.value.message


def test_a_bad_line_still_names_its_custom_id_when_it_has_one():
    with pytest.raises(LineError) as err:
        parse_line(line(url="/v1/completions"), 1, CHAT)
    assert err.value.custom_id == "a"


@pytest.mark.parametrize("head, name, expected", [
    (b'{"a": 1}\n{"b": 2}\n', "x.jsonl", "jsonl"),
    (b'garbage\n{"b": 2}\n', "x.jsonl", "jsonl"),  # one bad line is the dispatcher's to report
    (b"PAR1\x00\x01", "x.parquet", "parquet"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", "x.png", None),
    (b"just some text\nno json here\n", "x.txt", None),
    (b"not parquet", "x.parquet", None),
    (b"[" * 10_000 + b"]" * 10_000 + b'\n{"b": 2}\n', "x.jsonl", "jsonl"),  # a line too deep is one bad line
])
def test_sniffing_tells_jsonl_and_parquet_from_anything_else(head, name, expected):
    assert sniff_file(io.BytesIO(head), name) == expected


LONG = b'{"custom_id": "a", "pad": "' + b"x" * (SNIFF_BYTES + 10) + b'"}\n'


@pytest.mark.parametrize("content", [LONG, LONG + b'{"b": 2}\n', b'{"b": 2}\n' + LONG, LONG * 3, LONG.rstrip()])
def test_where_a_long_line_falls_changes_nothing(content):
    assert sniff_file(io.BytesIO(content), "x.jsonl") == "jsonl"


def test_a_long_binary_first_line_is_still_binary():
    assert sniff_file(io.BytesIO(b"\xff\xfe" + b"\x00" * (SNIFF_BYTES * 2)), "x.bin") is None


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a"])
def test_object_keys_never_leave_the_root(key):
    with pytest.raises(ValueError):
        check_key(key)


SHAPE = Shape(context=512, overhead=20, max_output_tokens=32, sep=1)


def test_a_document_that_fits_is_one_call():
    p = plan(SHAPE.window, SHAPE)
    assert p.pieces == 1 and not p.map_reduce and p.calls == 1
    assert (p.input_tokens_bound, p.output_tokens_bound) == (SHAPE.window + 20, 32)


def test_a_long_document_is_split_and_reduced_within_the_context():
    doc = 10 * SHAPE.window + 1
    p = plan(doc, SHAPE)
    assert p.map_reduce and p.pieces == 11 and p.reduce_levels == (1,)  # group = 460 // 33 = 13
    pieces = split_even(list(range(doc)), p.pieces)
    assert sum(map(len, pieces)) == doc and max(map(len, pieces)) <= SHAPE.window
    assert max(map(len, pieces)) - min(map(len, pieces)) <= 1
    assert p.output_tokens_bound == 12 * 32
    # Every reduce call's content fits: `group` summaries of at most max_output + sep tokens.
    assert SHAPE.group * (SHAPE.max_output_tokens + SHAPE.sep) <= SHAPE.window


def test_very_long_documents_reduce_in_several_levels():
    p = plan(200 * SHAPE.window, SHAPE)
    assert p.pieces == 200 and p.reduce_levels == (16, 2, 1)
    assert [len(g) for g in groups(list(range(200)), SHAPE.group)][-1] == 200 - 15 * 13


def test_a_shape_that_cannot_combine_summaries_is_refused():
    with pytest.raises(PlanError, match="too large"):
        plan(1000, Shape(context=512, overhead=20, max_output_tokens=200, sep=1))
    with pytest.raises(PlanError, match="no room"):
        plan(10, Shape(context=64, overhead=40, max_output_tokens=30, sep=1))


def test_a_line_asking_for_a_held_format_is_refused_and_text_is_taken():
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    assert parse_line(line(body={**body, "response_format": {"type": "text"}}), 1, CHAT).messages
    with pytest.raises(LineError) as refused:
        parse_line(line(body={**body, "response_format": {"type": "json_object"}}), 3, CHAT)
    assert refused.value.code == "invalid_request" and "line 3: body.response_format" in refused.value.message
    assert refused.value.custom_id == "a"
