"""Finding text that is not text in parsed JSON, and the API's refusal of a body holding it."""
from __future__ import annotations

import json

from api.text_guard import is_json, refusal
from models.text import MAX_JSON_DEPTH, nested_too_deep, unencodable_at


def test_the_first_bad_string_or_key_is_found_by_its_path():
    assert unencodable_at({"a": ["ok", {"b": "\ud800"}]}) == ("a", 1, "b")
    assert unencodable_at({"ok": 1, "k\udfff": 2}) == ("k\\udfff",)
    assert unencodable_at(["fine", "\U0001f600", 3, None, {"x": [1.5]}]) is None
    assert unencodable_at("\udfff") == ()


def test_a_body_is_refused_only_for_real_surrogates():
    assert refusal(json.dumps({"stop": "\udfff"}).encode()).status_code == 400
    assert refusal(b'{"a": "\xed\xa0\x80"}').status_code == 400  # surrogate as UTF-8 bytes
    assert refusal(b'{"a": "\xff"}').status_code == 400  # not UTF-8 at all
    assert refusal(json.dumps({"a": "\U0001f600"}).encode()) is None  # a pair: one real character
    assert refusal(b'{"a": "\\\\ud800"}') is None  # an escaped backslash, then plain text
    assert refusal(b'{not json \\ud800') is None  # the route's own parsing reports it


def test_which_bodies_are_json():
    assert is_json(None) and is_json("application/json") and is_json("application/merge-patch+json; charset=utf-8")
    assert not is_json("multipart/form-data; boundary=x") and not is_json("text/plain")


def test_nesting_depth_is_read_from_the_text_without_parsing_it():
    def nest(depth: int, inner: bytes = b"1") -> bytes:
        return b"[" * depth + inner + b"]" * depth
    assert not nested_too_deep(nest(MAX_JSON_DEPTH)) and nested_too_deep(nest(MAX_JSON_DEPTH + 1))
    assert nested_too_deep(b'{"a": {"b": ' + nest(MAX_JSON_DEPTH - 1) + b"}}")
    # Many brackets side by side are not deep, and brackets inside strings do not count,
    # escaped quotes included.
    assert not nested_too_deep(b"[" + b"[]," * 1000 + b"[]]")
    assert not nested_too_deep(b'["' + b"[" * 1000 + b'"]')
    assert not nested_too_deep(b'["\\", "\"' + b"{" * 1000 + b'"]')


def test_a_body_nested_too_deep_is_refused_before_it_is_parsed():
    for inner in (b'"\\ud800"', b"1"):
        refused = refusal(b"[" * 10_000 + inner + b"]" * 10_000)
        assert refused is not None and refused.status_code == 400
        error = json.loads(refused.body)["error"]
        assert error["code"] == "nesting_too_deep" and error["type"] == "invalid_request_error", error
    assert refusal(b"[" * MAX_JSON_DEPTH + b"1" + b"]" * MAX_JSON_DEPTH) is None
