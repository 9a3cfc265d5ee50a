"""The Kafka broker frozen (SIGSTOP ~15 s, then SIGCONT), then stopped cleanly and started
again on the same storage, under light traffic, with the platform as deployed (the API,
admission, a worker on an engine of known speed, the projector: each its own process) on a
broker of the test's own (`tests.kafka_broker`; the session's shared broker is never
touched). What must hold:

- a request made while the broker is gone gets 503 (`Retry-After`, OpenAI error shape)
  within a few seconds (`LEDGERLM_DECISION_TIMEOUT_S` and the look for a decision), never
  a 500 or a hang; once the API has met the outage, within `PROMPT_S`;
- every process rides the outage out, and new requests succeed afterwards without a restart;
- every request that got a 2xx has its events on the log, and no settlement is lost or
  doubled: each reservation settles exactly once on the log, and once in the usage ledger.
"""
from __future__ import annotations

import sqlite3
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict

import httpx
import pytest

from models import topics
from models.events import decode
from pipelines.generation.idempotency import client_request_id
from tests.harness import MODEL_ALIAS
from tests.helpers import Launched, wait_until
from tests.kafka_broker import DedicatedBroker
from tests.perf.deployed import deployed

DECISION_S = 3.0
# A request made during the outage is answered within this: the API's Kafka calls are
# bounded by the decision timeout, plus the look for a decision (2 s), plus a loaded host.
BOUND_S = 12.0
# Once the API knows the log is away (`api.log_watch`), a request is refused within this.
PROMPT_S = 1.0
KNOWN_S = 0.5  # a request begun this long after the first refusal finds the log known away
FREEZE_S = 15.0
STOPPED_S = 10.0
RECOVER_S = 90.0
ENVIRONMENT = {"LEDGERLM_ENGINE_FACTORY": "tests.slow_engine:SlowEngine.from_settings", "LEDGERLM_CPUS": "all",
               "LEDGERLM_TEST_TOKEN_PAUSE_S": "0.01", "LEDGERLM_DECISION_TIMEOUT_S": str(DECISION_S),
               "LEDGERLM_GRACE_S": "5", "LEDGERLM_AUDIT_SIGNING_KEY": "outage-test-signing-key"}
OUTAGE_CODES = {"log_unavailable", "admission_timeout", "no_capacity"}


class Traffic:
    """`clients` clients, each sending small generations back to back, each with its own
    request id, noting the phase of the test each began in, its status, error code and time."""

    def __init__(self, base_url: str, secret: str, clients: int = 2):
        self.phase = "before"
        self.results: list[dict] = []
        self.entered: list[tuple[str, float]] = [("before", time.monotonic())]
        self._stop = threading.Event()
        self._client = httpx.Client(base_url=base_url, timeout=60, headers={"Authorization": f"Bearer {secret}"})
        self._threads = [threading.Thread(target=self._run, name=f"traffic-{i}", daemon=True) for i in range(clients)]

    def enter(self, phase: str) -> None:
        """Requests from now on began in `phase`."""
        self.phase = phase
        self.entered.append((phase, time.monotonic()))

    def start(self) -> "Traffic":
        for thread in self._threads:
            thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            rid, phase, t0 = f"outage-{uuid.uuid4().hex[:12]}", self.phase, time.monotonic()
            result = {"request_id": rid, "phase": phase, "status": None, "code": None, "retry_after": None}
            try:
                r = self._client.post("/v1/generations", json={
                    "request_id": rid, "model_alias": MODEL_ALIAS, "input": "hello there", "max_output_tokens": 4,
                    "ignore_eos": True, "stream": False, "deadline_ms": 20_000})
                result.update(status=r.status_code, retry_after=r.headers.get("retry-after"))
                try:
                    body = r.json()
                    result["code"] = body["error"]["code"] if "error" in body else body.get("type")
                    result["reason"] = body.get("reason")  # why a cancelled one was
                except ValueError:
                    result["code"] = f"not JSON: {r.text[:200]!r}"
            except httpx.HTTPError as exc:
                result["code"] = f"{type(exc).__name__}: {exc}"
            result["elapsed_s"], result["ended_at"] = time.monotonic() - t0, time.monotonic()
            self.results.append(result)
            self._stop.wait(0.1)

    def succeeded_in(self, phase: str) -> bool:
        return any(r["phase"] == phase and r["status"] == 200 for r in self.results)

    def outage_lasted(self, phase: str, length_s: float) -> bool:
        """The outage begun with `phase` has lasted `length_s`, and a request begun in it was
        answered (a 503 within the decision bound: the clients met the outage)."""
        began = max(t for p, t in self.entered if p == phase)
        return (time.monotonic() - began >= length_s
                and any(r["phase"] == phase and r["status"] is not None for r in self.results))

    def halt(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)
        self._client.close()


def _summary(results: list[dict]) -> str:
    phases: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        phases[r["phase"]].append(r)
    return "\n".join(f"{phase:>10}: {len(rs)} requests, {dict(Counter((r['status'], r['code']) for r in rs))}, "
                     f"slowest {max(r['elapsed_s'] for r in rs):.1f} s" for phase, rs in phases.items())


def _by_request(log, topic) -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for record in log.read_topic(topic.name):
        env = decode(record.value)
        found[env.correlation_id].append(env.event_type)
    return found


def _usage_rows(db_path) -> Counter:
    with sqlite3.connect(db_path) as db:
        return Counter(row[0] for row in db.execute("SELECT source_id FROM usage_ledger WHERE source = 'generation'"))


@pytest.mark.timing
def test_the_platform_rides_out_a_frozen_then_a_restarted_broker(tiny_model_dir, tmp_path, monkeypatch):
    broker = DedicatedBroker(tmp_path / "kafka")
    try:
        broker.start()
        monkeypatch.setenv("LEDGERLM_TEST_KAFKA", broker.url)  # `deployed` runs on this broker
        with deployed("kafka", tiny_model_dir, tmp_path / "deployed", max_seqs=4, take_ahead=0, stream_linger_ms=0,
                      environment=ENVIRONMENT) as platform, \
                Launched([sys.executable, "-m", "api.cli", "serve", "projector"], env=platform.env,
                         log=tmp_path / "projector.log", ready='"projector": "ready"', ready_s=120,
                         stop_s=30) as projector:
            tenant_id, secret = platform.tenant()
            with httpx.Client(base_url=platform.base_url, timeout=30,
                              headers={"Authorization": f"Bearer {secret}"}) as client:
                wait_until(lambda: client.get("/v1/models").status_code == 200, 30, what="the API to know the key")
            traffic = Traffic(platform.base_url, secret).start()
            try:
                wait_until(lambda: traffic.succeeded_in("before"), 60, what="a generation before the outage")

                broker.freeze()
                traffic.enter("frozen")  # after the freeze: one begun before may be served once it thaws
                wait_until(lambda: traffic.outage_lasted("frozen", FREEZE_S), FREEZE_S + 30, every_s=0.2,
                           what="the freeze to last its length and a request to meet it")
                traffic.enter("thawing")
                broker.thaw()
                traffic.enter("thawed")
                wait_until(lambda: traffic.succeeded_in("thawed"), RECOVER_S, what="a generation after the freeze")
                projector.check()

                traffic.enter("stopping")
                broker.stop()
                traffic.enter("stopped")
                wait_until(lambda: traffic.outage_lasted("stopped", STOPPED_S), STOPPED_S + 30, every_s=0.2,
                           what="the stop to last its length and a request to meet it")
                traffic.enter("starting")
                broker.start()
                traffic.enter("restarted")
                wait_until(lambda: traffic.succeeded_in("restarted"), RECOVER_S, what="a generation after the restart")
            finally:
                traffic.halt()
            projector.check()
            results = traffic.results
            print(_summary(results), [(p, round(t - traffic.entered[0][1], 1)) for p, t in traffic.entered])

            # Answered, promptly, in the OpenAI shape: a 2xx or a 503 that says to come back.
            unanswered = [r for r in results if r["status"] not in (200, 503)]
            assert not unanswered, unanswered
            back_at = dict(traffic.entered)
            for phase, back in (("frozen", "thawing"), ("stopped", "starting")):
                # Begun while the broker was gone: a 503 within the bound, or (begun near the
                # end) served within the bound once the broker was back.
                during = [r for r in results if r["phase"] == phase]
                assert any(r["status"] == 503 for r in during), f"no request was refused while {phase}: {during}"
                wrong = [r for r in during if r["elapsed_s"] > BOUND_S
                         or (r["status"] == 503 and (r["code"] not in OUTAGE_CODES or not r["retry_after"]))
                         or (r["status"] == 200 and r["ended_at"] < back_at[back])]
                assert not wrong, (phase, wrong)
                # Once the API has met the outage (its first refusal), it knows the log is away:
                # requests begun after that are refused at once, not after the log's timeout.
                first_refusal = min(r["ended_at"] for r in during if r["status"] == 503)
                known = [r for r in during if r["ended_at"] - r["elapsed_s"] > first_refusal + KNOWN_S]
                assert known, f"no request began once the API knew the log was away ({phase}): {during}"
                slow = [r for r in known if r["status"] == 503 and r["elapsed_s"] > PROMPT_S]
                assert not slow, (phase, slow)
            refused = [r for r in results if r["status"] == 503]
            assert all(r["code"] in OUTAGE_CODES and r["retry_after"] for r in refused), refused

            # The log: every 2xx is there, completed; every reservation settles exactly once.
            ok = {client_request_id(tenant_id, r["request_id"]) for r in results if r["status"] == 200}
            assert all(r["code"] == "completed" for r in results if r["status"] == 200), \
                [r for r in results if r["status"] == 200 and r["code"] != "completed"]

            def settled_all():
                ledger = _by_request(platform.log, topics.LEDGER)
                open_ = [rid for rid, kinds in ledger.items() if "BudgetReserved" in kinds and "UsageSettled" not in kinds]
                return None if open_ else ledger
            ledger = wait_until(settled_all, 60, what="every reservation settled (cancelled, completed or expired)")
            outcomes = _by_request(platform.log, topics.OUTCOMES)
            for rid in ok:
                kinds = ledger.get(rid, [])
                assert kinds.count("BudgetReserved") == 1 and kinds.count("UsageSettled") == 1, (rid, kinds)
                assert "GenerationCompleted" in outcomes.get(rid, []), (rid, outcomes.get(rid))
            doubled = {rid: kinds for rid, kinds in ledger.items()
                       if kinds.count("UsageSettled") > 1 or kinds.count("BudgetReserved") > 1
                       or kinds.count("ReservationReleased") > 1}
            assert not doubled, doubled

            # The projector, never restarted, has every settlement in the usage ledger, once.
            settled = {rid for rid, kinds in ledger.items() if "UsageSettled" in kinds}
            db = tmp_path / "deployed" / "ledgerlm.db"

            def projected():
                rows = _usage_rows(db) if db.exists() else Counter()
                return rows if settled <= set(rows) else None
            rows = wait_until(projected, 60, what="the projector to catch up")
            assert all(rows[rid] == 1 for rid in settled)
    finally:
        broker.close()
