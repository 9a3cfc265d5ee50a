"""What `/openapi.json` says each route may answer, and OPTIONS.

Every error the API sends has one shape (`api.errors`), so each route documents its
statuses from one shared mapping, `error_responses(...)`, given to `include_router` per
feature: the statuses every authenticated route has, plus the feature's own. FastAPI's
422 is dropped from the schema: validation errors are 400 here (`api.errors`).

OPTIONS on a path answers 204 with `Allow` naming its methods (404 for no route), as
RFC 9110 has it, rather than a 405.
"""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import error_response

_MEANING = {
    400: "Invalid request: a value is out of range, malformed or not text", 401: "Missing or invalid API key",
    403: "The key lacks a scope or right this needs", 404: "No such object (or another tenant's)",
    409: "Conflicts with an earlier request or the object's state", 410: "Gone: expired or retired",
    413: "The request or its input is too large", 429: "Over a rate or budget limit; see Retry-After",
    500: "Internal error", 503: "No capacity or a dependency is unavailable now; see Retry-After",
    504: "The generation did not start or finish before its deadline",
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = Field(description="The request field the error is about, if one")
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error shape."""

    error: ErrorDetail


def error_responses(*statuses: int) -> dict[int | str, dict]:
    """The `responses=` entries for these statuses, each with the error schema."""
    return {status: {"model": ErrorResponse, "description": _MEANING[status]} for status in statuses}


AUTHENTICATED = (400, 401, 403)
# Generations answer JSON, or server-sent events when streamed.
SSE = {200: {"description": "The result, or its events when streamed",
             "content": {"text/event-stream": {"schema": {"type": "string"}}}}}
EVERY_ROUTE = error_responses(500)
GENERATING = {**SSE, **error_responses(*AUTHENTICATED, 404, 409, 410, 413, 429, 503, 504)}
STREAM = {**SSE, **error_responses(*AUTHENTICATED, 404, 410)}
OBJECTS = error_responses(*AUTHENTICATED, 404, 409)
UPLOADS = error_responses(*AUTHENTICATED, 404, 409, 413)
READS = error_responses(*AUTHENTICATED, 404)


def install_openapi(app: FastAPI) -> None:
    """The schema FastAPI builds, less the 422 it adds to every route with parameters."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            schemas = schema.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


class AllowOptions:
    """ASGI middleware answering OPTIONS from the app's routes."""

    def __init__(self, app: ASGIApp, *, routes):
        self.app, self.routes = app, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            return await self.app(scope, receive, send)
        methods: set[str] = set()
        for route in self.routes:
            match, _ = route.matches(scope)  # PARTIAL: the path is the route's, the method is not
            if match is not Match.NONE and getattr(route, "methods", None):
                methods |= set(route.methods)
        if not methods:
            return await error_response(404, "Not Found", "not_found")(scope, receive, send)
        allow = ", ".join(sorted(methods | {"OPTIONS"}))
        await Response(status_code=204, headers={"Allow": allow})(scope, receive, send)
