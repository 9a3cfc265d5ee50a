"""Shared fixtures: real services from the environment (never skipped when missing),
the one vLLM engine of the session, and a whole platform per event-log adapter."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from models.settings import Settings

pytest_plugins = ["tests.engine_fixture", "tests.kafka_cleanup"]

SERVICE_VARS = {
    "kafka": "LEDGERLM_TEST_KAFKA",
    "postgres": "LEDGERLM_TEST_POSTGRES",
    "redis": "LEDGERLM_TEST_REDIS",
    "s3": "LEDGERLM_TEST_S3",
}


def service_url(name: str) -> str:
    """The URL of a real service started by `infra/services.sh up`. A missing one fails
    the test loudly: these tests exist to run against the real thing."""
    var = SERVICE_VARS[name]
    value = os.environ.get(var)
    if not value:
        pytest.fail(f"{var} is not set: start the services with `make services-up` and source "
                    f".local/services.env (or run `make test`)", pytrace=False)
    return value


@pytest.fixture(scope="session")
def kafka_url() -> str:
    return service_url("kafka")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    return service_url("postgres")


@pytest.fixture(scope="session")
def redis_url() -> str:
    return service_url("redis")


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    return service_url("s3")


def make_log_opener(kind: str, tmp_dir: Path):
    """A function opening fresh handles onto one isolated log of the given adapter."""
    from tests.harness import isolated_log_opener

    return isolated_log_opener(kind, tmp_dir, kafka_url=service_url("kafka") if kind == "kafka" else "")


@pytest.fixture(scope="session", params=["embedded", "kafka"])
def platform(request, engine_runner, tmp_path_factory):
    """The whole platform on each event-log adapter, shared by the tests of a session."""
    from tests.harness import Platform

    home = tmp_path_factory.mktemp(f"platform-{request.param}")
    opener = make_log_opener(request.param, home)
    settings = Settings(home=home, grace_s=5.0, default_deadline_ms=60_000)
    plat = Platform(opener, engine_runner, settings)
    plat.kind = request.param
    yield plat
    plat.close()
