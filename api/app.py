"""The FastAPI application. `create_app` takes what it needs; `build_services` is what
the `ledgerlm serve api` entrypoint wires from settings."""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import errors, openapi
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
from api.stream_hub import StreamHub
from models.settings import Settings
from pipelines.bootstrap import Bootstrap
from pipelines.tokencount import TokenCounter

logger = logging.getLogger(__name__)


def build_services(settings: Settings) -> Services:
    platform = Bootstrap(settings)
    log = platform.event_log()
    return Services(settings=settings, log=log, registry_view=platform.registry_view(log), counter=TokenCounter(),
                    hub=StreamHub(log))


WARM_EVERY_S = 2.0  # how often the API looks for newly approved revisions to warm


async def _keep_tokenizers_warm(services: Services) -> None:
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
        except Exception:  # noqa: BLE001 - warming is an optimisation; requests load what they need
            logger.exception("warming tokenizers failed; trying again")
        await asyncio.sleep(WARM_EVERY_S)


FLEET_EVERY_S = 0.5  # how often the API reads the fleet topic: a worker that leaves is seen within this


async def _follow_fleet(services: Services) -> None:
    """Keeps the fleet view current, so a request asks it without reading the log."""
    while True:
        try:
            await asyncio.to_thread(services.fleet.refresh)
        except Exception:  # noqa: BLE001 - a request that finds no worker reads the topic itself
            logger.exception("reading the fleet topic failed; trying again")
        await asyncio.sleep(FLEET_EVERY_S)


def create_app(services: Services) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        services.hub.start()
        warming = asyncio.get_running_loop().run_in_executor(None, services.index.warm)
        tokenizers = asyncio.create_task(_keep_tokenizers_warm(services))
        fleet = asyncio.create_task(_follow_fleet(services))
        try:
            yield
        finally:
            tokenizers.cancel()
            fleet.cancel()
            await services.reaper.aclose()
            services.hub.stop()
            await asyncio.gather(warming, tokenizers, fleet, return_exceptions=True)
            services.close_readers()

    app = FastAPI(title="ledgerlm", lifespan=lifespan, responses=openapi.EVERY_ROUTE)
    app.state.services = services
    errors.install(app)
    openapi.install_openapi(app)
    install_docs_access(app, services.settings.docs_access)
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
    ]:
        app.include_router(router, responses=responses)
    return app
