"""One mapper from failures to the OpenAI error shape:
{"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from models.events_generation import GenerationRejected
from pipelines.generation.idempotency import IdempotencyKeyInvalid
from pipelines.generation.submission import SubmissionError

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 409: "conflict_error", 410: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "service_unavailable",
          504: "timeout_error"}

# Admission's reasons: load and budget are worth retrying later (429); limits are not.
# The fleet's own (shedding, no live worker) are the service's, apart from the tenant's limits: 503.
_REJECTION_STATUS = {"rate": 429, "concurrency": 429, "tokens": 429, "spend": 429,
                     "input_too_large": 413, "output_too_large": 400, "unknown_model": 404,
                     "tenant_disabled": 403, "model_retired": 410, "priority_not_allowed": 403,
                     "shed": 503, "no_capacity": 503, "kv_capacity": 503, "shadow_dropped": 503}


class ClientGone(Exception):
    """The client disconnected before its response could be sent."""


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None, model_revision: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.headers = status, message, code, param, headers
        self.model_revision = model_revision  # a revision refused for capacity, for the overload ladder


def rejection_error(rejected: GenerationRejected, model_revision: str | None = None) -> "ApiError":
    """The HTTP form of an admission rejection. Load and budgets are a 429 with the
    Retry-After admission worked out; a deadline or budget that this request can never
    meet (admission gives no time to come back) is a 400: retrying would not help."""
    status = _REJECTION_STATUS.get(rejected.reason, 429)
    if status == 429 and rejected.retry_after_ms is None:
        status = 400
    headers = None
    if status in (429, 503):  # the fleet's 503s (shed, no live worker) say when to come back too
        headers = {"Retry-After": str(max(1, math.ceil((rejected.retry_after_ms or 1000) / 1000)))}
    return ApiError(status, rejected.message, code=rejected.reason, headers=headers, model_revision=model_revision)


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "api_error"), "param": param, "code": code}}


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.code, exc.param, exc.headers)

    @app.exception_handler(IdempotencyKeyInvalid)
    async def _idempotency_key(_: Request, exc: IdempotencyKeyInvalid):
        return error_response(400, str(exc), "invalid_idempotency_key", "Idempotency-Key")

    @app.exception_handler(ClientGone)
    async def _client_gone(_: Request, exc: ClientGone):
        return Response(status_code=499)  # nobody reads it; nginx's code for the log line

    @app.exception_handler(SubmissionError)
    async def _submission(_: Request, exc: SubmissionError):
        headers = None if exc.retry_after_s is None else {"Retry-After": str(exc.retry_after_s)}
        return error_response(exc.status, str(exc), exc.code, exc.param, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "string_too_long" and "input" in {str(p) for p in first.get("loc", ())}:
            return error_response(413, "The input is too large", "input_too_large", "input")
        where = list(first.get("loc", ()))
        loc = [str(p) for p in (where[1:] if where[:1] in (["body"], ["query"], ["path"], ["header"]) else where)]
        if first.get("type") == "json_invalid":
            return error_response(400, "The request body is not valid JSON", "invalid_json")
        message = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid value')}"
        return error_response(400, message, "invalid_value", ".".join(loc) or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), None, None, getattr(exc, "headers", None))
