"""The last net: an exception no handler mapped becomes a 500 in the OpenAI error shape,
and the connection stays usable.

Starlette's own net answers in plain text and then re-raises, so the server drops the
keep-alive connection without saying so and the client's next request on it fails.
Here the exception is logged and answered, and not raised on. Only when the response had
already started (a stream) is it raised on: then closing the connection is the only
way left to tell the client that the body is incomplete.
"""
from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response

logger = logging.getLogger(__name__)


class InternalErrors:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            logger.exception("internal error serving %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            response = error_response(500, "The server had an error while processing the request",
                                      "internal_error")
            await response(scope, receive, send)
