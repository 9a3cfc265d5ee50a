"""The FastAPI application. `create_app` takes what it needs; `build_services` is what
the `ledgerlm serve api` entrypoint wires from settings."""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import errors, outage
from api.deps import Services
from api.body_limit import BodyLimit
from api.routes import generations, metrics as metrics_routes, openai_compat, streams
from api.routes import admin as admin_routes, models as model_routes
from api.routes import batches, files, summarizations
from api.routes import audit as audit_routes, usage as usage_routes
from api.routes import fleet as fleet_routes
from api.stream_hub import StreamHub
from models.settings import Settings
from pipelines.bootstrap import Bootstrap
from pipelines.outage import Readiness, is_transient, readiness_registry
from pipelines.tokencount import TokenCounter

logger = logging.getLogger(__name__)


def build_services(settings: Settings) -> Services:
    platform = Bootstrap(settings)
    # Short calls: a request that meets a broken log is answered 503 within the decision
    # timeout, never held for the client's default 30 s (`api.outage`).
    log = platform.event_log(timeout_s=max(1.0, settings.decision_timeout_s))
    return Services(settings=settings, log=log, registry_view=platform.registry_view(log), counter=TokenCounter(),
                    hub=StreamHub(log))


WARM_EVERY_S = 2.0  # how often the API looks for newly approved revisions to warm


async def _keep_tokenizers_warm(services: Services, readiness: Readiness) -> None:
    """Loads the tokenizer of every approved revision: those there at start, then each one
    approved later, within `WARM_EVERY_S`, so no request waits seconds for a load."""
    tried: set[str] = set()
    while True:
        try:
            registry = await asyncio.to_thread(services.registry_view.refresh)
            new = {r.model_path for r in registry.revisions.values()} - tried
            if new:
                tried.update(new)
                await asyncio.to_thread(services.counter.warm, new)
            readiness.up()
        except Exception as exc:  # noqa: BLE001 - warming is an optimisation; requests load what they need
            if is_transient(exc):
                readiness.down(exc)  # said once per outage
            else:
                logger.exception("warming tokenizers failed; trying again")
        await asyncio.sleep(WARM_EVERY_S)


FLEET_EVERY_S = 0.5  # how often the API reads the fleet topic: a worker that leaves is seen within this


async def _follow_fleet(services: Services, readiness: Readiness) -> None:
    """Keeps the fleet view current, so a request asks it without reading the log."""
    while True:
        try:
            await asyncio.to_thread(services.fleet.refresh)
            readiness.up()
        except Exception as exc:  # noqa: BLE001 - a request that finds no worker reads the topic itself
            if is_transient(exc):
                readiness.down(exc)  # said once per outage
            else:
                logger.exception("reading the fleet topic failed; trying again")
        await asyncio.sleep(FLEET_EVERY_S)


def create_app(services: Services) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        services.hub.start()
        warming = asyncio.get_running_loop().run_in_executor(None, services.index.warm)
        tokenizers = asyncio.create_task(_keep_tokenizers_warm(services, registry_ready))
        fleet = asyncio.create_task(_follow_fleet(services, fleet_ready))
        try:
            yield
        finally:
            tokenizers.cancel()
            fleet.cancel()
            await services.reaper.aclose()
            await outage.aclose()
            services.hub.stop()
            await asyncio.gather(warming, tokenizers, fleet, return_exceptions=True)
            services.close_readers()

    # Whether the API's background readers reach the log (`ledgerlm_ready` at /metrics).
    registry_ready, fleet_ready = Readiness("api-registry", stall_s=None), Readiness("api-fleet", stall_s=None)
    app = FastAPI(title="ledgerlm", lifespan=lifespan)
    app.state.services = services
    hub_ready = getattr(services.hub, "readiness", None)
    app.state.readiness = [registry_ready, fleet_ready, *([hub_ready] if hub_ready is not None else [])]
    services.metrics.registry.register(readiness_registry(*app.state.readiness))
    errors.install(app)
    outage.install(app)
    app.add_middleware(BodyLimit)
    app.include_router(generations.router)
    app.include_router(streams.router)
    app.include_router(openai_compat.router)
    app.include_router(metrics_routes.router)
    app.include_router(model_routes.router)
    app.include_router(admin_routes.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(summarizations.router)
    app.include_router(usage_routes.router)
    app.include_router(audit_routes.router)
    app.include_router(fleet_routes.router)

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    return app
