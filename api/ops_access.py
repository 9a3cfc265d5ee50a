"""Who may read `/metrics` and the API's documentation (`/docs`, `/redoc`, `/openapi.json`).

Each has a mode in the settings: `open` (anyone: the default, as scrapers and quick starts
expect), `key` (a bearer of the settings' `ops_token`, the bootstrap token, or a key with
the `operator` scope), or `off` (404). They name tenant ids and every route's shape, so a
deployment facing the internet sets `key` or `off`.
"""
from __future__ import annotations

import hmac

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import JSONResponse

from api.admin_access import operator_actor
from api.deps import ServicesDep
from api.errors import ApiError

DOC_PATHS = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def _check(mode: str, request: Request, svc) -> None:
    if mode == "open":
        return
    if mode == "off":
        raise ApiError(404, "Not found", code="not_found")
    token = svc.settings.ops_token
    scheme, _, secret = request.headers.get("authorization", "").partition(" ")
    if token and scheme.lower() == "bearer" and hmac.compare_digest(secret.strip().encode(), token.encode()):
        return
    operator_actor(request, svc)  # 401 without a key, 403 for a key that is not an operator's


def metrics_access(request: Request, svc: ServicesDep) -> None:
    _check(svc.settings.metrics_access, request, svc)


def docs_access(request: Request, svc: ServicesDep) -> None:
    _check(svc.settings.docs_access, request, svc)


def install_docs_access(app: FastAPI, mode: str) -> None:
    """Replaces FastAPI's own documentation routes with guarded ones (or none, when off)."""
    if mode == "open":
        return
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in DOC_PATHS]
    if mode == "off":
        return
    guarded = [Depends(docs_access)]

    @app.get("/openapi.json", include_in_schema=False, dependencies=guarded)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=guarded)
    def docs():
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - Swagger UI")

    @app.get("/redoc", include_in_schema=False, dependencies=guarded)
    def redoc():
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")
