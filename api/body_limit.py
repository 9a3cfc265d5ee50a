"""A cap on request body size for the generation routes: an oversize body is a 413
before it is read into memory, whether or not it declares a Content-Length."""
from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response

GENERATION_PATHS = ("/v1/generations", "/v1/chat/completions", "/v1/completions")


class _TooLarge(HTTPException):
    """An HTTPException, so the app's error mapper answers it even mid-body-read."""

    def __init__(self, max_bytes: int):
        super().__init__(413, f"The request body exceeds {max_bytes} bytes")


class BodyLimit:
    def __init__(self, app: ASGIApp, *, max_bytes: int = 8 * 1024 * 1024, paths: tuple[str, ...] = GENERATION_PATHS):
        self.app, self.max_bytes, self.paths = app, max_bytes, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.paths):
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(scope, receive, send)
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(413, f"The request body exceeds {self.max_bytes} bytes", "request_too_large")
        await response(scope, receive, send)
