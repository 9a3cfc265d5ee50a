"""Who is using the console, and on which tenants.

A user signs in with an API key (or the platform's bootstrap token). Keys with the
`operator` scope see every tenant; keys with `tenant_admin` see their own tenant only, as
on the `/v1/admin` routes (`api.admin_access.Actor`): any other tenant is a 404, and every
query is filtered on the tenant the user may see, server-side. Other keys cannot sign in.
"""
from __future__ import annotations

import hmac
import threading
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import parse_qs, urlsplit

from fastapi import Depends, Request

from api.admin_access import Actor
from api.console.session import COOKIE, Session, SessionStore
from api.deps import Services, ServicesDep
from models.authz import is_operator, is_tenant_admin
from models.registry import Principal, Registry, hash_secret

_store_lock = threading.Lock()
MAX_FORM_BYTES = 16_384


# Why a session ended, by the code the sign-in page is sent (never text from a URL).
ENDED = {"token": "The bootstrap token is no longer set.",
         "key": "The key of this session is revoked, expired or suspended."}


class SignInNeeded(Exception):
    def __init__(self, reason: str | None = None):
        self.reason = reason  # a key of ENDED


class ConsoleRefusal(Exception):
    """Answered as an HTML page with this status (404 for another tenant's object)."""

    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


def sessions(request: Request) -> SessionStore:
    state = request.app.state
    with _store_lock:
        if getattr(state, "console_sessions", None) is None:
            state.console_sessions = SessionStore()
        return state.console_sessions


@dataclass
class User:
    actor: Actor  # as the admin events record it, and what it may manage
    session: Session
    principal: Principal | None  # None: the bootstrap token
    registry: Registry  # as read for this request

    @property
    def operator(self) -> bool:
        return self.actor.operator

    @property
    def name(self) -> str:
        return self.actor.name

    def tenant(self, asked: str | None) -> str | None:
        """The tenant a page shows: a tenant admin's own (asking for another is a 404);
        for an operator the one asked for, or None for every tenant."""
        if not self.operator:
            if asked and asked != self.actor.tenant_id:
                raise ConsoleRefusal(404, "No such tenant")
            return self.actor.tenant_id
        if asked and asked not in self.registry.tenants:
            raise ConsoleRefusal(404, "No such tenant")
        return asked or None

    def require_operator(self) -> None:
        if not self.operator:
            raise ConsoleRefusal(404, "No such page")


def actor_for(principal: Principal | None) -> Actor | None:
    """The console's actor for a key, or None when the key may not sign in."""
    if principal is None:
        return Actor("bootstrap", None)
    name = f"{principal.tenant_id}/{principal.key_id}"
    if is_operator(principal.scopes):
        return Actor(name, None)
    if is_tenant_admin(principal.scopes):
        return Actor(name, principal.tenant_id)
    return None


def check_secret(svc: Services, secret: str) -> tuple[str | None, str | None]:
    """(the secret's hash to keep, None for the bootstrap token; refusal) for a sign-in."""
    secret = secret.strip()
    token = svc.settings.bootstrap_token
    if token and hmac.compare_digest(secret.encode(), token.encode()):
        return None, None
    registry = svc.registry_view.refresh()
    principal = registry.authenticate(secret) if secret else None
    if principal is None:
        return None, "Incorrect, revoked or expired API key"
    if actor_for(principal) is None:
        return None, "This key has neither the 'operator' nor the 'tenant_admin' scope"
    if principal.tenant_id in registry.suspended:
        return None, "This tenant is suspended"
    return hash_secret(secret), None


def console_user(request: Request, svc: ServicesDep) -> User:
    session = sessions(request).get(request.cookies.get(COOKIE))
    if session is None:
        raise SignInNeeded()
    # While the log is known to be away, keys are checked against the registry as last read.
    registry = svc.registry_view.registry if svc.log_watch.away else svc.registry_view.refresh()
    if session.secret_sha256 is None:
        if not svc.settings.bootstrap_token:
            raise SignInNeeded("token")
        return User(Actor("bootstrap", None), session, None, registry)
    principal = registry.authenticate_digest(session.secret_sha256)
    actor = actor_for(principal) if principal is not None else None
    if actor is None or principal.tenant_id in registry.suspended:
        sessions(request).close(request.cookies.get(COOKIE))
        raise SignInNeeded("key")
    return User(actor, session, principal, registry)


UserDep = Annotated[User, Depends(console_user)]


def same_origin(request: Request) -> bool:
    """A browser names where a form was sent from; one sent from another site is refused
    (SameSite=Strict keeps the cookie off it too; this also covers the sign-in form)."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form's fields (the last of each name), at most `MAX_FORM_BYTES`."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise ConsoleRefusal(413, "This form is too large")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, errors="strict")
    except UnicodeDecodeError:
        raise ConsoleRefusal(400, "This form is not UTF-8") from None
    return {name: values[-1] for name, values in fields.items()}


async def action_form(request: Request, user: User) -> dict[str, str]:
    """The form of an action, once its origin and its CSRF token (tied to the session) pass."""
    if not same_origin(request):
        raise ConsoleRefusal(403, "This form was sent from another site")
    form = await read_form(request)
    if not hmac.compare_digest(form.get("csrf", "").encode(), user.session.csrf.encode()):
        raise ConsoleRefusal(403, "This form is stale or was not sent by the console; reload the page")
    if user.principal is not None and request.app.state.services.log_watch.away:
        raise ConsoleRefusal(503, "The event log is unavailable; try again shortly")
    return form
