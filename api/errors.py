"""One mapper from failures to the OpenAI error shape:
{"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipelines.submission import SubmissionError

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
          429: "rate_limit_error", 503: "service_unavailable"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.headers = status, message, code, param, headers


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "api_error"), "param": param, "code": code}}


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.code, exc.param, exc.headers)

    @app.exception_handler(SubmissionError)
    async def _submission(_: Request, exc: SubmissionError):
        return error_response(exc.status, str(exc), exc.code, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            return error_response(400, "The request body is not valid JSON", "invalid_json")
        message = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid value')}"
        return error_response(400, message, "invalid_value", ".".join(loc) or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), None, None, getattr(exc, "headers", None))
