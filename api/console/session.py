"""Console sessions, held by the API process; the browser holds only an opaque id.

The cookie is `<session id>.<HMAC of it>`: unguessable, and checked before any lookup. The
session keeps the SHA-256 of the key it was opened with (what the registry indexes keys
by), never the key, so every request is authorised again against the registry: a key
revoked or expired ends its sessions at once. Sessions live for `ttl_s` and are lost when
the process restarts (the user signs in again); an API replica only knows its own.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field

COOKIE = "ledgerlm_console"
DEFAULT_TTL_S = 8 * 3600
MAX_SESSIONS = 10_000  # the oldest go first past this: a flood of sign-ins cannot grow memory without bound


@dataclass
class Session:
    sid: str
    secret_sha256: str | None  # None: opened with the platform's bootstrap token
    csrf: str  # the token each action form carries
    expires_at: float
    notices: list[dict] = field(default_factory=list)  # shown once on the next page (a new key's secret)

    def take_notices(self) -> list[dict]:
        shown, self.notices = self.notices, []
        return shown


class SessionStore:
    def __init__(self, *, key: bytes | None = None, ttl_s: float = DEFAULT_TTL_S, max_sessions: int = MAX_SESSIONS):
        self._key = key or secrets.token_bytes(32)
        self.ttl_s, self.max_sessions = ttl_s, max_sessions
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def _mac(self, sid: str) -> str:
        digest = hmac.new(self._key, sid.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def open(self, secret_sha256: str | None) -> tuple[Session, str]:
        """A new session and the cookie value naming it."""
        now = time.monotonic()
        session = Session(secrets.token_urlsafe(32), secret_sha256, secrets.token_urlsafe(32), now + self.ttl_s)
        with self._lock:
            self._expire(now)
            while len(self._sessions) >= self.max_sessions:
                self._sessions.pop(next(iter(self._sessions)))
            self._sessions[session.sid] = session
        return session, f"{session.sid}.{self._mac(session.sid)}"

    def get(self, cookie: str | None) -> Session | None:
        sid = self._sid(cookie)
        if sid is None:
            return None
        with self._lock:
            session = self._sessions.get(sid)
            if session is not None and session.expires_at <= time.monotonic():
                self._sessions.pop(sid, None)
                return None
            return session

    def close(self, cookie: str | None) -> None:
        sid = self._sid(cookie)
        if sid is not None:
            with self._lock:
                self._sessions.pop(sid, None)

    def _sid(self, cookie: str | None) -> str | None:
        if not cookie or "." not in cookie:
            return None
        sid, _, mac = cookie.rpartition(".")
        return sid if hmac.compare_digest(mac.encode(), self._mac(sid).encode()) else None

    def _expire(self, now: float) -> None:
        for sid in [s for s, session in self._sessions.items() if session.expires_at <= now]:
            del self._sessions[sid]

    def __len__(self) -> int:
        return len(self._sessions)
