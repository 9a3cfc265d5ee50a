"""The API's bound on waiting (`api.outage`): with no admission deciding, a generation is
answered 503 `admission_timeout` within the decision timeout and a cancel for it follows its
request on the log; with the log hanging on appends, 503 `log_unavailable` within the bound,
and once the append goes through after all, the cancel follows it; once the log is known
to be away, 503 `log_unavailable` at once, and service again as soon as it answers; a log
error reaching any route is a 503 in the OpenAI shape, never a plain-text 500. Embedded log,
no admission."""
from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest
from kafka import errors as kerr

from api.app import create_app
from api.deps import Services
from api.stream_hub import StreamHub
from models import topics
from models.events import decode
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.admin.commands import RegistryView
from pipelines.eventlog import open_event_log
from pipelines.generation.idempotency import client_request_id
from pipelines.bootstrap import topic_specs
from pipelines.generation.tokencount import TokenCounter
from tests.harness import MODEL_ALIAS, new_tenant, serve_api
from tests.helpers import wait_until

DECISION_S = 1.0
BOUND_S = DECISION_S + 2.0 + 3.0  # the decision timeout, the look for a decision, a loaded host
PROMPT_S = 0.9  # once the log is known away: less than the decision timeout, which it used to wait


class AllWorkersLive:
    """A fleet where every revision is served (no worker runs in these tests)."""

    def refresh(self):
        return self

    def serves_soon(self, pool, revision, **_):
        return True

    def capacity(self):
        return {}

    def live(self):
        return []

    def lost(self):
        return []

    def close(self):
        pass


class HangingAppends:
    """The API's log, whose appends to the requests topic wait for `release` while `hang` is set."""

    def __init__(self, log):
        self._log, self.hang, self.release = log, threading.Event(), threading.Event()

    def append(self, topic, messages):
        if self.hang.is_set() and topic == topics.REQUESTS.name:
            self.release.wait(30)
        return self._log.append(topic, messages)

    def __getattr__(self, name):
        return getattr(self._log, name)


class BrokerAway:
    """The API's log as a frozen broker leaves it while `away` is set: appends and end
    offsets answer nothing until the Kafka client's timeout (`hang_s`), then time out."""

    def __init__(self, log, hang_s: float):
        self._log, self.hang_s, self.away, self.back = log, hang_s, threading.Event(), threading.Event()

    def _frozen(self, call):
        if self.away.is_set() and not self.back.wait(self.hang_s):
            raise kerr.KafkaTimeoutError(f"{call}: no answer in {self.hang_s * 1000:.0f} ms")

    def append(self, topic, messages):
        self._frozen("append")
        return self._log.append(topic, messages)

    def end_offset(self, topic, partition):
        self._frozen("end_offset")
        return self._log.end_offset(topic, partition)

    def __getattr__(self, name):
        return getattr(self._log, name)


@pytest.fixture
def api(tmp_path, tiny_model_dir):
    url = f"sqlite:///{tmp_path / 'eventlog.db'}"
    setup = open_event_log(url)
    setup.ensure_topics(topic_specs())
    view = RegistryView(setup)
    tenant_id, secret = new_tenant(view)
    admin.approve_model(view, alias=MODEL_ALIAS, model_revision="tiny@outage", model_path=str(tiny_model_dir),
                        engine_config_hash="x", max_model_len=512, actor="tests")
    log = HangingAppends(BrokerAway(open_event_log(url), hang_s=DECISION_S * 3))
    settings = Settings(home=tmp_path, event_log_url=url, decision_timeout_s=DECISION_S)
    services = Services(settings=settings, log=log, registry_view=RegistryView(log), counter=TokenCounter(),
                        hub=StreamHub(log, idle_wait_s=0.02), fleet=AllWorkersLive())
    server, thread, port = serve_api(create_app(services), "api-outage")
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, headers={"Authorization": f"Bearer {secret}"})
    try:
        yield client, log, setup, services, tenant_id
    finally:
        log.release.set()
        log.back.set()
        client.close()
        server.should_exit = True
        thread.join(30)
        setup.close()


def _requests_of(log, tenant_id: str, request_id: str) -> list[str]:
    """The requests topic's events of the generation whose client chose `request_id`."""
    on_log = client_request_id(tenant_id, request_id)
    return [e.event_type for e in (decode(r.value) for r in log.read_topic(topics.REQUESTS.name))
            if e.correlation_id == on_log]


def _cancelled(log, tenant_id: str, request_id: str) -> list[str] | None:
    kinds = _requests_of(log, tenant_id, request_id)
    return kinds if "CancelRequested" in kinds else None


def _generate(client, request_id: str) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    response = client.post("/v1/generations", json={"request_id": request_id, "model_alias": MODEL_ALIAS,
                                                    "input": "hello", "max_output_tokens": 4, "stream": False})
    return response, time.monotonic() - t0


def _is_503(response: httpx.Response, code: str) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == code, response.text
    assert response.json()["error"]["type"] == "service_unavailable"
    assert int(response.headers["retry-after"]) > 0


def test_an_undecided_request_is_503_within_the_bound_and_cancelled(api):
    client, _, setup, _, tenant_id = api
    rid = f"undecided-{uuid.uuid4().hex[:8]}"
    response, took = _generate(client, rid)  # no admission runs: nothing decides it
    _is_503(response, "admission_timeout")
    assert DECISION_S <= took <= BOUND_S, took
    kinds = wait_until(lambda: _cancelled(setup, tenant_id, rid), 10, what="the cancel of the request the client was told failed")
    assert kinds == ["GenerationRequested", "CancelRequested"], kinds


def test_an_append_that_hangs_is_503_within_the_bound_and_cancelled_once_it_lands(api):
    client, log, setup, _, tenant_id = api
    rid = f"hanging-{uuid.uuid4().hex[:8]}"
    log.hang.set()
    response, took = _generate(client, rid)
    _is_503(response, "log_unavailable")
    assert took <= BOUND_S, took
    assert _requests_of(setup, tenant_id, rid) == []
    log.hang.clear()
    log.release.set()  # the append goes through after all: its cancel must follow it
    kinds = wait_until(lambda: _cancelled(setup, tenant_id, rid), 10, what="the cancel after the late request")
    assert kinds == ["GenerationRequested", "CancelRequested"], kinds


def test_a_log_error_on_any_route_is_a_503_in_the_openai_shape(api, monkeypatch):
    client, _, _, services, _ = api

    def frozen(*_, **__):
        raise kerr.KafkaTimeoutError("Failed to get offsets by timestamps in 3000 ms")
    monkeypatch.setattr(services.registry_view, "refresh", frozen)
    response = client.get("/v1/models")
    _is_503(response, "log_unavailable")


@pytest.mark.timing
def test_once_the_log_is_known_away_a_request_is_503_at_once_and_served_when_it_is_back(api):
    client, log, setup, services, tenant_id = api
    watch = services.log_watch
    log.away.set()
    # The watch's own look meets the frozen log: slower than its bound is away.
    wait_until(lambda: watch.away, watch.SLOW_S + 5, what="the API to know the log is away")
    rids = [f"away-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    for rid in rids:
        response, took = _generate(client, rid)
        _is_503(response, "log_unavailable")
        assert took < PROMPT_S, f"{took:.2f} s: the log was known away, the answer should not wait for it"
    with httpx.Client(base_url=client.base_url, timeout=10, headers={"Authorization": "Bearer sk-wrong"}) as bad:
        assert bad.post("/v1/generations", json={"model_alias": MODEL_ALIAS, "input": "x"}).status_code == 401
    models = client.get("/v1/models")  # reads go on, from the registry as last read
    assert models.status_code == 200 and MODEL_ALIAS in {m["id"] for m in models.json()["data"]}, models.text
    assert all(_requests_of(setup, tenant_id, rid) == [] for rid in rids)

    log.back.set()
    log.away.clear()
    wait_until(lambda: not watch.away, 10, what="the API to see the log back")
    rid = f"back-{uuid.uuid4().hex[:8]}"
    response, _ = _generate(client, rid)
    _is_503(response, "admission_timeout")  # on the log this time: only admission is missing here
    assert _requests_of(setup, tenant_id, rid)[:1] == ["GenerationRequested"]
