"""Text that is not text: a `str` holding a lone UTF-16 surrogate, which Python's JSON
reader makes of `"\\ud800"` (and of surrogates encoded as UTF-8 bytes) and which no
encoder accepts. Found anywhere in parsed JSON, keys included."""
from __future__ import annotations

import re

# How deep arrays and objects may nest in a request body or a batch line. Real requests
# (messages, tool schemas, metadata) stay far below it; Python's JSON reader recurses per
# level and fails near 1,000 with a RecursionError, which no caller should ever see.
MAX_JSON_DEPTH = 128
# A JSON string (escapes included) or one bracket: what the depth scan steps over.
_STRING_OR_BRACKET = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unencodable_at(value, path: tuple = ()) -> tuple | None:
    """The path of the first string (or object key) in `value` that cannot be encoded as
    UTF-8, or None. A bad key is named in the path with its surrogate escaped."""
    pending = [(value, path)]
    while pending:
        item, where = pending.pop()
        if isinstance(item, str):
            if not encodable(item):
                return where
        elif isinstance(item, dict):
            for key, inner in item.items():
                if not encodable(key):
                    return (*where, key.encode("utf-8", "backslashreplace").decode())
                pending.append((inner, (*where, key)))
        elif isinstance(item, list):
            pending.extend((inner, (*where, i)) for i, inner in enumerate(item))
    return None


def nested_too_deep(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text `raw` nests arrays or objects more than `limit` deep, read
    from the text itself (brackets inside strings do not count), without parsing it.
    Nearly free for ordinary bodies: one that holds fewer brackets cannot be too deep."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    depth = 0
    for match in _STRING_OR_BRACKET.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False
