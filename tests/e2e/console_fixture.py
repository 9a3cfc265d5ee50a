"""One platform for the console's tests (HTTP and browser alike): admission, a worker on a
fake engine (one token per generation), the API with its console, and a projection
database on the real PostgreSQL that the tests project into when they choose
(`project()`), so what a page shows is exactly what was projected.

Two tenants with traffic of their own (`a`, `b`), each with a tenant admin key, and an
operator key: enough to see isolation, pagination and totals.
"""
from __future__ import annotations

import re
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Iterator

import httpx
import pytest
import sqlalchemy as sa

from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.signing import signer_from_key
from pipelines.bootstrap import Bootstrap
from pipelines.projections import all_projections
from pipelines.projections.runner import ProjectionRunner
from tests.conftest import drop_postgres_databases, make_log_opener
from tests.db_templates import migrated_postgres
from tests.e2e.fake_platform import FakeTinyEngine
from tests.harness import MODEL_ALIAS, Platform
from tests.helpers import wait_until
from workers.engine_runner import EngineRunner

GENERATIONS_A = 12  # a page of 10 and a second page of 2
GENERATIONS_B = 3


@dataclass
class ConsolePlatform:
    platform: Platform
    settings: Settings
    runner: ProjectionRunner
    engine: sa.Engine
    tenants: dict[str, SimpleNamespace] = field(default_factory=dict)
    operator: str = ""

    @property
    def base_url(self) -> str:
        return self.platform.base_url

    def project(self) -> None:
        self.runner.run_until_caught_up()

    def ledger_micros(self, tenant_id: str | None = None) -> int:
        query = "SELECT COALESCE(SUM(cost_micros), 0) FROM usage_ledger" + (" WHERE tenant_id = :t" if tenant_id else "")
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text(query), {"t": tenant_id}).scalar())

    def browser_client(self) -> httpx.Client:
        """A client that keeps cookies and follows nothing, as a browser's first request."""
        return httpx.Client(base_url=self.base_url, timeout=30, follow_redirects=False)

    @contextmanager
    def signed_in(self, secret: str) -> Iterator[httpx.Client]:
        with self.browser_client() as client:
            response = client.post("/console/login", data={"api_key": secret})
            assert response.status_code == 303, response.text
            yield client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF token on the page"
    return found.group(1)


def _traffic(platform: Platform, secret: str, count: int, tag: str) -> list[str]:
    ids = []
    with platform.client(secret) as client:
        for i in range(count):
            answer = client.post("/v1/generations", json={"model_alias": MODEL_ALIAS, "input": f"{tag} number {i}",
                                                          "max_output_tokens": 4, "stream": False})
            assert answer.status_code == 200, answer.text
            ids.append(answer.json()["request_id"])
    return ids


@pytest.fixture(scope="session")
def console_platform(tmp_path_factory, tiny_model_dir):
    home = tmp_path_factory.mktemp("console")
    url, name = migrated_postgres("console_")
    settings = Settings(home=home, grace_s=5.0, default_deadline_ms=60_000, database_url=url,
                        bootstrap_token="console-bootstrap-" + uuid.uuid4().hex)
    engine_runner = EngineRunner(FakeTinyEngine(tiny_model_dir), name="fake-engine").start()
    platform = Platform(make_log_opener("embedded", home), engine_runner, settings)
    platform.kind = "embedded"
    engine = Bootstrap(settings).projection_db()
    runner = ProjectionRunner(platform._log(), engine, all_projections(signer_from_key(settings.audit_signing_key)))
    made = ConsolePlatform(platform, settings, runner, engine)
    try:
        for tag, count in (("a", GENERATIONS_A), ("b", GENERATIONS_B)):
            tenant_id, tenant_admin = platform.tenant(scopes=("tenant_admin",), application="admin")
            chat, _ = admin.issue_key(platform.view, tenant_id=tenant_id, actor="tests", application_id="chat",
                                      scopes=("generate", "usage"))
            search, _ = admin.issue_key(platform.view, tenant_id=tenant_id, actor="tests", application_id="search",
                                        scopes=("generate",))
            ids = _traffic(platform, chat, count - count // 3, f"{tag}chat") + _traffic(
                platform, search, count // 3, f"{tag}search")
            made.tenants[tag] = SimpleNamespace(tenant_id=tenant_id, admin=tenant_admin, chat=chat, request_ids=ids)
        _, made.operator = platform.tenant(scopes=("operator",))
        expected = GENERATIONS_A + GENERATIONS_B

        def all_settled() -> bool:  # admission settles each a moment after its answer
            made.project()
            with engine.connect() as conn:
                return conn.execute(sa.text("SELECT COUNT(*) FROM usage_ledger")).scalar() == expected
        wait_until(all_settled, 60, every_s=0.2, what="every generation to be settled and projected")
        yield made
    finally:
        platform.close()
        engine_runner.close()
        engine.dispose()
        drop_postgres_databases([name])
