"""Text that cannot be encoded as UTF-8 never gets past the door.

JSON may spell a lone UTF-16 surrogate (`"\\ud800"`), and Python's JSON reader turns it
(and UTF-8-encoded surrogate bytes) into a `str` that no encoder accepts: left alone it
fails deep inside a handler, e.g. while an event is encoded, after another was appended.
So every JSON request body is checked here, once, before any route sees it: every string
and every object key, wherever it sits (messages, `stop`, `user`, metadata, fields a
route ignores but an Idempotency-Key hashes). A body that is not UTF-8 is refused too, and
so is one nested deeper than MAX_JSON_DEPTH, before anything parses it (Python's JSON
reader recurses per level and would fail with a RecursionError, a 500).
"""
from __future__ import annotations

import json
import re
from email.message import Message as _ContentType

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response
from models.text import MAX_JSON_DEPTH, nested_too_deep, unencodable_at

_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
# A JSON escape of a surrogate (\uD800-\uDFFF), possibly preceded by an escaped backslash;
# only a hint: the parsed value decides.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads this body as JSON (it does when no content type is given)."""
    if not content_type:
        return True
    parsed = _ContentType()
    parsed["content-type"] = content_type
    main, _, sub = parsed.get_content_type().partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def refusal(body: bytes):
    """The 400 for a body with text that cannot be encoded as UTF-8 or nested too deep, or
    None if it is fine
    (or is not JSON at all, which the route's own parsing reports)."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return error_response(400, "The request body is not valid UTF-8", "invalid_encoding")
    if nested_too_deep(body):
        return error_response(400, f"The request body nests arrays or objects more than {MAX_JSON_DEPTH} levels deep",
                              "nesting_too_deep")
    if not _SURROGATE_ESCAPE.search(body):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    where = unencodable_at(data)
    if where is None:
        return None
    param = ".".join(str(p) for p in where) or None
    return error_response(400, f"{param or 'body'}: a string holds a lone UTF-16 surrogate, which is not text "
                          "(it cannot be encoded as UTF-8)", "invalid_encoding", param)


class TextGuard:
    """ASGI middleware: reads a JSON body whole (the route would anyway), checks it, and
    hands the same bytes on, or answers 400 without calling the route."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _METHODS:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        content_type = headers.get(b"content-type")
        if not is_json(content_type.decode("latin-1") if content_type else None):
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left: let the route see it
                return await self.app(scope, _replay([message], receive), send)
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        refused = refusal(body) if body else None
        if refused is not None:
            return await refused(scope, receive, send)
        await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive), send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    async def replayed() -> Message:
        return messages.pop(0) if messages else await receive()
    return replayed
