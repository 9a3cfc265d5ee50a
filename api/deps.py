"""What routes may ask for. Routes never parse credentials themselves: the tenant comes
from the key, and only from the key."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine

from api.disconnect import DisconnectReaper
from api.errors import ApiError
from api.ladder import Ladder
from api.log_watch import LogWatch
from api.outage import log_unavailable
from api.metrics import ApiMetrics
from api.request_stream import StreamHistory
from models.digests import TenantDigests
from models.prompt_class import PromptThresholds
from models.registry import Principal
from models.settings import Settings
from pipelines.admin.commands import RegistryView
from pipelines.bootstrap import Bootstrap
from pipelines.eventlog import EventLog
from pipelines.fleet import FleetView
from pipelines.generation.request_index import RequestIndex
from pipelines.cache.semantic import AnswerCache, embedder_for
from pipelines.generation.tokencount import TokenCounter


@dataclass
class Services:
    """Everything the API process holds, built once by the entrypoint (see api.app)."""

    settings: Settings
    log: EventLog
    registry_view: RegistryView
    counter: TokenCounter
    hub: object  # api.stream_hub.StreamHub
    # How long a generation outlives its client's disconnect (a reconnect keeps it); None:
    # the settings' `disconnect_grace_s`.
    disconnect_grace_s: float | None = None
    index: RequestIndex | None = None
    metrics: ApiMetrics = field(default_factory=ApiMetrics)
    reaper: DisconnectReaper | None = None
    history: StreamHistory | None = None
    fleet: FleetView | None = None  # the workers serving now, from the fleet topic
    digests: TenantDigests | None = None  # keys prompt digests per tenant (settings' digest_key)
    log_watch: LogWatch | None = None  # whether the log is known to be away (its looks run in the app)
    cache: AnswerCache | None = None  # the semantic cache, where tenants' policies turn it on
    ladder: Ladder = field(default_factory=Ladder)  # the overload ladder's cooldowns (api.ladder)

    def __post_init__(self) -> None:
        self.digests = self.digests or TenantDigests.from_settings(self.settings)
        self.fleet = self.fleet or FleetView(self.log)
        self.metrics.fleet = self.fleet  # its series are read from the fleet view at scrape time
        self.metrics.prompt_thresholds = PromptThresholds.from_settings(self.settings)
        self.index = self.index or RequestIndex(self.log)
        self.history = self.history or StreamHistory(self.log)
        self.log_watch = self.log_watch or LogWatch(self.log)
        self.cache = self.cache or AnswerCache(embedder_for(self.settings),
                                               max_entries_per_tenant=self.settings.cache_max_entries_per_tenant)
        self.metrics.cache = self.cache
        if self.disconnect_grace_s is None:
            self.disconnect_grace_s = self.settings.disconnect_grace_s
        self.reaper = self.reaper or DisconnectReaper(self.log, self.hub, self.metrics,
                                                      grace_s=self.disconnect_grace_s)

    def close_readers(self) -> None:
        """Closes what the API opened to read the log on demand (the index, stream history)."""
        self.index.close()
        self.history.close()
        self.fleet.close()


def services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(services)]


_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def current_principal(request: Request, svc: ServicesDep) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise ApiError(401, "Missing bearer API key", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})
    away = svc.log_watch.away
    # While the log is known to be away, keys are checked against the registry as last read.
    registry = svc.registry_view.registry if away else svc.registry_view.refresh()
    principal = registry.authenticate(secret.strip())
    if principal is None:
        raise ApiError(401, "Incorrect, revoked or expired API key", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})
    if principal.tenant_id in registry.suspended:
        raise ApiError(403, "This tenant is suspended", code="tenant_suspended")
    if away and request.method in _WRITES:  # it would write to the log: say at once that it cannot
        raise log_unavailable()
    return principal


PrincipalDep = Annotated[Principal, Depends(current_principal)]


def scope(name: str):
    def check(principal: PrincipalDep) -> Principal:
        if name not in principal.scopes:
            raise ApiError(403, f"This key lacks the '{name}' scope", code="insufficient_scope")
        return principal

    return Depends(check)


GenerateDep = Annotated[Principal, scope("generate")]


_projection_db_lock = threading.Lock()


def projection_db(request: Request) -> Engine:
    """The projection database of this app, opened on first use (never at import)."""
    state = request.app.state
    with _projection_db_lock:
        if getattr(state, "projection_db", None) is None:
            state.projection_db = Bootstrap(state.services.settings).projection_db()
        return state.projection_db


ProjectionDbDep = Annotated[Engine, Depends(projection_db)]
