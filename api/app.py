"""The FastAPI application. `create_app` takes what it needs; `build_services` is what
the `ledgerlm serve api` entrypoint wires from settings."""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import errors
from api.deps import Services
from api.body_limit import BodyLimit
from api.routes import generations, metrics as metrics_routes, openai_compat, streams
from api.routes import admin as admin_routes, models as model_routes
from api.routes import batches, files, summarizations
from api.routes import audit as audit_routes, usage as usage_routes
from api.stream_hub import StreamHub
from models.settings import Settings
from pipelines.admin import RegistryView
from pipelines.bootstrap import open_log
from pipelines.tokencount import TokenCounter


def build_services(settings: Settings) -> Services:
    log = open_log(settings)
    return Services(settings=settings, log=log, registry_view=RegistryView(log), counter=TokenCounter(),
                    hub=StreamHub(log))


def _warm_tokenizers(services: Services) -> None:
    registry = services.registry_view.refresh()
    services.counter.warm(revision.model_path for revision in registry.revisions.values())


def create_app(services: Services) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        services.hub.start()
        loop = asyncio.get_running_loop()
        warming = [loop.run_in_executor(None, services.index.warm), loop.run_in_executor(None, _warm_tokenizers, services)]
        try:
            yield
        finally:
            await services.reaper.aclose()
            services.hub.stop()
            await asyncio.gather(*warming, return_exceptions=True)
            services.close_readers()

    app = FastAPI(title="ledgerlm", lifespan=lifespan)
    app.state.services = services
    errors.install(app)
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

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    return app
