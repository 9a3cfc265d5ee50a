"""Text that is not text: a `str` holding a lone UTF-16 surrogate, which Python's JSON
reader makes of `"\\ud800"` (and of surrogates encoded as UTF-8 bytes) and which no
encoder accepts. Found anywhere in parsed JSON, keys included."""
from __future__ import annotations


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
