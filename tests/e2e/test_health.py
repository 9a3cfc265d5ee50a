"""Liveness and readiness: `/healthz` and `/health` answer while the process serves;
`/readyz` is 503 naming what does not answer (event log, database; a worker's engine)
and 200 once everything does."""
from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine

from pipelines.metrics import MetricsServer
from tests.helpers import wait_until


def test_health_and_readiness_of_the_api(api):
    with api.client() as client:  # no key: orchestrators have none
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/health").json() == {"status": "ok"}
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {
            "status": "ready", "checks": {"event_log": True, "database": True, "api-registry": True, "api-fleet": True,
                                          **{r.component: True for r in api.app.state.readiness[2:]}}}
        registry_reader = api.app.state.readiness[0]  # a background reader riding out an outage
        registry_reader.down("broker down")
        try:
            down = client.get("/readyz")
        finally:
            registry_reader.up()
        assert down.status_code == 503 and down.json()["checks"]["api-registry"] is False
        assert down.json()["checks"]["event_log"] is True
        good_db = api.app.state.projection_db
        api.app.state.projection_db = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none",
                                                    connect_args={"connect_timeout": 1})
        try:
            down = client.get("/readyz")
        finally:
            api.app.state.projection_db = good_db
        assert down.status_code == 503 and down.json()["checks"]["database"] is False
        assert down.json()["checks"]["event_log"] is True

        log, end_offset = api.services.log, api.services.log.end_offset

        def unreachable(*_args, **_kw):
            raise ConnectionError("broker down")
        log.end_offset = unreachable
        try:
            down = client.get("/readyz")
        finally:
            log.end_offset = end_offset
        assert down.status_code == 503 and down.json()["checks"]["event_log"] is False
        assert down.json()["checks"]["database"] is True
        assert client.get("/health").status_code == 200, "liveness does not depend on the others"
        # The API's watch on the log saw the failure too, and sees the log back at its next look.
        wait_until(lambda: client.get("/readyz").status_code == 200, 10, every_s=0.1, what="ready again")


def test_a_worker_is_ready_while_its_engine_lives():
    engine = {"alive": False}
    server = MetricsServer(CollectorRegistry(), port=0, ready=lambda: {"engine": engine["alive"]})
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
            assert client.get("/healthz").json() == {"status": "ok"}
            down = client.get("/readyz")
            assert down.status_code == 503 and down.json() == {"status": "not_ready", "checks": {"engine": False}}
            engine["alive"] = True
            assert client.get("/readyz").status_code == 200
            assert "process_cpu_seconds_total" in client.get("/metrics").text
    finally:
        server.close()
