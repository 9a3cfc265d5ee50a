"""The web console: server-rendered pages under `/console` of the API app.

Signed in with a key (`api.console.auth`), a tenant admin sees its own tenant and an
operator every tenant. Pages read the projections and the registry; actions are admin
events through the same commands as `/v1/admin`. Every page is one HTML response (plus
its stylesheet): no script, no per-row requests.
"""
from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, RedirectResponse

from api.console import export, keys, ops, pages
from api.console.auth import ENDED, ConsoleRefusal, SignInNeeded, check_secret, read_form, same_origin, sessions
from api.console.render import HERE, page
from api.console.session import COOKIE
from api.deps import ServicesDep

router = APIRouter(prefix="/console", include_in_schema=False)


@router.get("/login")
def login_page(request: Request, reason: str | None = None):
    return page(request, "login.html", reason=ENDED.get(reason or ""))


@router.post("/login")
async def login(request: Request, svc: ServicesDep):
    if not same_origin(request):
        raise ConsoleRefusal(403, "This form was sent from another site")
    form = await read_form(request)
    digest, refusal = check_secret(svc, form.get("api_key", ""))
    if refusal:
        return page(request, "login.html", reason=refusal, status_code=401)
    _, cookie = sessions(request).open(digest)
    response = RedirectResponse("/console/usage", status_code=303)
    response.set_cookie(COOKIE, cookie, httponly=True, samesite="strict", path="/console",
                        secure=request.url.scheme == "https", max_age=int(sessions(request).ttl_s))
    return response


@router.post("/logout")
async def logout(request: Request):
    if not same_origin(request):
        raise ConsoleRefusal(403, "This form was sent from another site")
    store = sessions(request)
    session = store.get(request.cookies.get(COOKIE))
    form = await read_form(request)
    if session is not None and form.get("csrf") == session.csrf:
        store.close(request.cookies.get(COOKIE))
    response = RedirectResponse("/console/login", status_code=303)
    response.delete_cookie(COOKIE, path="/console")
    return response


@router.get("/static/console.css")
def stylesheet():
    return FileResponse(HERE / "static" / "console.css", media_type="text/css",
                        headers={"Cache-Control": "public, max-age=3600"})


def install(app: FastAPI) -> None:
    """Adds the console's routes and its two answers that are pages rather than JSON."""
    @app.exception_handler(SignInNeeded)
    async def _sign_in(request: Request, exc: SignInNeeded):
        target = "/console/login" + (f"?reason={exc.reason}" if exc.reason else "")
        response = RedirectResponse(target, status_code=303)
        if exc.reason:
            response.delete_cookie(COOKIE, path="/console")
        return response

    @app.exception_handler(ConsoleRefusal)
    async def _refused(request: Request, exc: ConsoleRefusal):
        return page(request, "refusal.html", status_code=exc.status, message=exc.message)

    app.include_router(router)
    for module in (pages, keys, ops, export):
        app.include_router(module.router)
