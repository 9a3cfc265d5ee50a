"""The API alone, served by uvicorn on a loopback port over an embedded log, with the tiny
model approved (its tokenizer counts input) and no worker: a request that passes every
check is refused at the last one, 503 `no_capacity`, so tests of what the API accepts
and refuses need no engine. Nothing is admitted, so whatever reaches the log stays there."""
from __future__ import annotations

from pathlib import Path

import httpx

from api.app import create_app
from migrations.runner import upgrade
from models import topics
from models.events import decode
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.admin.commands import RegistryView
from tests.conftest import make_log_opener
from tests.harness import MODEL_ALIAS, api_services, new_tenant, serve_api

__all__ = ["ApiAlone", "MODEL_ALIAS"]


class ApiAlone:
    def __init__(self, home: Path, model_dir: Path, *, services_hook=None):
        self.settings = Settings(home=home, grace_s=5.0, default_deadline_ms=60_000)
        upgrade(self.settings.database_url)  # the projector's tables, which the read routes query
        self.open_log = make_log_opener("embedded", home)
        self.admin_log = self.open_log()
        self.view = RegistryView(self.admin_log)
        self.model_revision = "tiny@test"
        admin.approve_model(self.view, alias=MODEL_ALIAS, model_revision=self.model_revision,
                            model_path=str(model_dir), engine_config_hash="test", max_model_len=512, actor="tests")
        self.services = api_services(self.settings, self.open_log())
        if services_hook is not None:
            services_hook(self.services)
        self.app = create_app(self.services)
        self.server, self.thread, self.port = serve_api(self.app, "api-alone", lifespan="on")
        self.base_url = f"http://127.0.0.1:{self.port}"

    def tenant(self, **kwargs) -> tuple[str, str]:
        return new_tenant(self.view, **kwargs)

    def client(self, secret: str | None = None, timeout_s: float = 30.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def appended(self, topic: topics.Topic, tenant_id: str) -> list:
        """Every event of `tenant_id` on `topic`, every partition read from its start."""
        return [env for env in (decode(r.value) for r in self.admin_log.read_topic(topic.name))
                if env.tenant_id == tenant_id]

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.services.log.close()
        self.admin_log.close()
