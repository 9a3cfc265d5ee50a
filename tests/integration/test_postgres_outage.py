"""PostgreSQL stopped under a running projector and the API's read routes, then started
again on the same data (a server of the test's own: `tests.dedicated_services`). What
must hold:

- the projector keeps running through the outage, reports not ready meanwhile, and
  resumes from the positions stored next to its rows: once caught up, the projections
  equal a clean replay of the log (nothing counted twice or skipped), and the usage
  totals are what the log says;
- the read routes (usage, quota, audit) answer 503 in the OpenAI error shape with
  Retry-After while the database is down, never a 500, and 200 again once it is back.
"""
from __future__ import annotations

import threading

import httpx

from api.app import create_app
from migrations.runner import upgrade
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.admin.commands import RegistryView
from pipelines.audit.digest import table_digests
from pipelines.audit.replay import replay
from pipelines.bootstrap import topic_specs
from pipelines.eventlog import open_event_log
from pipelines.outage import Readiness
from pipelines.projections.sql import open_projection_db
from tests.dedicated_services import DedicatedPostgres
from tests.harness import api_services, serve_api
from tests.helpers import wait_until
from tests.integration.conftest_ledger import EVERY, SIGNER, runner_for
from tests.ledger_workload import Workload, append_all

TENANT = "tenant-00"  # one of the workload's tenants; the test issues it a key
READ_ROUTES = ("/v1/usage?group_by=model", "/v1/usage/quota", "/v1/audit/events?limit=5")


def _caught_up(runner) -> bool:
    return all(lag.records == 0 for lag in runner.lag())


def _is_database_503(response: httpx.Response) -> bool:
    assert response.status_code in (200, 503), (response.status_code, response.text)  # never a 500
    if response.status_code != 503:
        return False
    error = response.json()["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "log_unavailable", error
    assert int(response.headers["retry-after"]) > 0
    return True


def _usage_totals(client: httpx.Client) -> dict[str, int]:
    response = client.get("/v1/usage", params={"group_by": "model"})
    assert response.status_code == 200, response.text
    rows = response.json()["data"]
    return {name: sum(row[name] for row in rows)
            for name in ("generations", "batch_chunks", "input_tokens", "output_tokens", "cost_micros")}


def test_the_projector_and_read_routes_ride_out_a_postgres_restart(tmp_path):
    log_url = f"sqlite:///{tmp_path / 'eventlog.db'}"
    log = open_event_log(log_url)
    log.ensure_topics(topic_specs())
    workload = Workload(seed=11, tenants=3)
    append_all(log, workload.admin() + workload.generations(200, total=1000))
    secret, _ = admin.issue_key(RegistryView(log), tenant_id=TENANT, actor="tests", scopes=("usage", "audit"))

    stop, errors = threading.Event(), []
    readiness = Readiness("projector")
    with DedicatedPostgres(tmp_path / "pg") as pg:
        upgrade(pg.url)
        runner = runner_for(log, pg.url, batch_events=200)

        def project() -> None:
            try:
                runner.run(stop, idle_s=0.1, readiness=readiness)
            except BaseException as exc:  # surfaced below: the loop must not end on an outage
                errors.append(exc)
        thread = threading.Thread(target=project, name="projector", daemon=True)
        api_log = open_event_log(log_url)
        server, api_thread, port = serve_api(create_app(api_services(
            Settings(home=tmp_path, event_log_url=log_url, database_url=pg.url), api_log)), "api-pg-outage")
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                              headers={"Authorization": f"Bearer {secret}"})
        thread.start()
        try:
            wait_until(lambda: _caught_up(runner) or errors, 60, what="the projector to catch up before the outage")
            for route in READ_ROUTES:
                assert client.get(route).status_code == 200, route

            applied_before = runner.events_applied
            append_all(log, workload.generations(800, start=200, total=1000))
            wait_until(lambda: runner.events_applied > applied_before or errors, 30,
                       what="the projector to start on the new events", every_s=0.01)
            pg.stop()  # most likely in the middle of a batch: the new events take many

            wait_until(lambda: not readiness.ready or errors, 30, what="the projector to report not ready")
            for route in READ_ROUTES:
                assert _is_database_503(client.get(route)), f"{route} answered while the database was down"
            assert thread.is_alive() and not errors, errors

            pg.start()
            wait_until(lambda: (readiness.ready and _caught_up(runner)) or errors, 60,
                       what="the projector ready and caught up after the restart", every_s=0.2)
            assert not errors and thread.is_alive(), errors
            assert readiness.outages == 1
            for route in READ_ROUTES:  # a pooled connection from before the restart is not handed out
                response = client.get(route)
                assert response.status_code == 200, (route, response.text)
            totals = _usage_totals(client)
        finally:
            stop.set()
            thread.join(30)
            client.close()
            server.should_exit = True
            api_thread.join(30)
            api_log.close()

        expected = workload.expected.settled[TENANT]
        assert totals == {"generations": expected["requests"], "batch_chunks": expected["batch_chunks"],
                          "input_tokens": expected["input_tokens"], "output_tokens": expected["output_tokens"],
                          "cost_micros": expected["cost_micros"]}
        engine = open_projection_db(pg.url)
        try:
            clean = replay(log, f"sqlite:///{tmp_path / 'replayed.db'}", SIGNER, checkpoint_every=EVERY)
            assert table_digests(engine) == clean.digests
        finally:
            engine.dispose()
    log.close()
