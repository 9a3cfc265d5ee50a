"""The FastAPI application. `create_app` takes what it needs; `build_services` is what
the `ledgerlm serve api` entrypoint wires from settings."""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import console, errors, openapi, outage
from api.deps import Services
from api.body_limit import BodyLimit
from api.server_errors import InternalErrors
from api.text_guard import TextGuard
from api.ops_access import install_docs_access
from api.routes import generations, metrics as metrics_routes, openai_compat, streams
from api.routes import admin as admin_routes, admin_keys, models as model_routes
from api.routes import batches, files, summarizations
from api.routes import audit as audit_routes, usage as usage_routes
from api.routes import fleet as fleet_routes, health as health_routes
from api.routes import cache as cache_routes, evals as eval_routes, rollouts as rollout_routes
from api.routes import routers as router_routes
from api.stream_hub import StreamHub
from models.settings import Settings
from pipelines.bootstrap import Bootstrap
from pipelines.outage import Readiness, is_transient, readiness_registry
from pipelines.generation.tokencount import TokenCounter

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
        watch = asyncio.create_task(services.log_watch.run())
        try:
            yield
        finally:
            tokenizers.cancel()
            fleet.cancel()
            watch.cancel()
            await services.reaper.aclose()
            await outage.aclose()
            services.hub.stop()
            await asyncio.gather(warming, tokenizers, fleet, watch, return_exceptions=True)
            services.close_readers()

    # Whether the API's background readers reach the log (`ledgerlm_ready` at /metrics).
    registry_ready, fleet_ready = Readiness("api-registry", stall_s=None), Readiness("api-fleet", stall_s=None)
    app = FastAPI(title="ledgerlm", lifespan=lifespan, responses=openapi.EVERY_ROUTE)
    app.state.services = services
    hub_ready = getattr(services.hub, "readiness", None)
    app.state.readiness = [registry_ready, fleet_ready, services.log_watch.readiness,
                           *([hub_ready] if hub_ready is not None else [])]
    services.metrics.registry.register(readiness_registry(*app.state.readiness))
    errors.install(app)
    openapi.install_openapi(app)
    install_docs_access(app, services.settings.docs_access)
    outage.install(app)
    # Outermost last: OPTIONS and the body checks come after the size limit, and an error
    # anywhere (these included) is answered in the OpenAI shape.
    app.add_middleware(TextGuard)
    app.add_middleware(openapi.AllowOptions, routes=app.router.routes)
    app.add_middleware(BodyLimit)
    app.add_middleware(InternalErrors)
    for router, responses in [
        (generations.router, openapi.GENERATING), (streams.router, openapi.STREAM),
        (openai_compat.router, openapi.GENERATING), (metrics_routes.router, {}), (model_routes.router, openapi.READS),
        (admin_routes.router, openapi.OBJECTS), (admin_keys.router, openapi.OBJECTS),
        (files.router, openapi.UPLOADS), (batches.router, openapi.OBJECTS),
        (summarizations.router, openapi.UPLOADS), (usage_routes.router, openapi.READS),
        (audit_routes.router, openapi.READS), (fleet_routes.router, openapi.READS), (health_routes.router, {}),
        (rollout_routes.router, openapi.OBJECTS), (eval_routes.router, openapi.OBJECTS),
        (cache_routes.router, openapi.OBJECTS), (router_routes.router, openapi.OBJECTS),
    ]:
        app.include_router(router, responses=responses)
    console.install(app)  # the web console's pages, under /console
    return app
