"""The platform as deployed (the API, admission, a worker on an engine of known speed, the
projector: each its own process) on a replicated three-node KRaft cluster of the test's
own (`tests.kafka_cluster`: replication 3, min.insync.replicas 2, producers with acks=all
and idempotence), under steady traffic, through two failures of one node each:

- the node leading the tenant's ledger partition is SIGKILLed, then restarted on its storage;
- the node leading it next is cut off the network (its link taken down), then reconnected.

What must hold: the platform keeps serving with a node killed (a request begun after the
kill is served), and the others fence a cut-off node and go on with two in sync; every request that got a 2xx has its events on the log exactly once,
and no event of any request is there twice; every reservation settles exactly once, for
what was generated, and the usage ledger charges each once, to the micro; the lost node
rejoins every in-sync replica set within a deadline once it is back.

It runs as root (it makes network namespaces), on the services of `infra/services.sh up`.
It once found a request settled twice in about one run in four: during a failover a
commit unit went through while admission took it for failed (its offsets not yet answered,
or the answer lost), and admission read its inputs and its ledger again before that unit
showed. Now the offsets are in before the commit is asked for, and a failed unit is settled
before anything is read again (`pipelines.eventlog.kafka_groups`).
"""
from __future__ import annotations

import sqlite3
import sys
from collections import Counter, defaultdict

import httpx
import pytest
from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from models import topics
from models.events import decode
from pipelines.eventlog import partition_for
from pipelines.generation.idempotency import client_request_id
from tests.e2e.test_log_outage import OUTAGE_CODES, Traffic
from tests.helpers import Launched, wait_until
from tests.kafka_cleanup import forget
from tests.kafka_cluster import REPLICAS, KafkaCluster
from tests.perf.deployed import deployed

OUTPUT_TOKENS = 4  # each request asks for 4 tokens and ignores end-of-sequence: 4 are generated
# A failover can cost a process a client request or two timing out (30 s each) on top of
# the broker session timeout and its own backoff; seen up to 75 s on this 2-CPU host.
FAILOVER_S = 150.0
REJOIN_S = 90.0
ENVIRONMENT = {"LEDGERLM_ENGINE_FACTORY": "tests.slow_engine:SlowEngine.from_settings", "LEDGERLM_CPUS": "all",
               "LEDGERLM_TEST_TOKEN_PAUSE_S": "0.01", "LEDGERLM_GRACE_S": "5",
               # A worker's heartbeats wait out a failover too (the broker session timeout, 6 s
               # here, then a metadata refresh): a shorter silence must not count as lost.
               "LEDGERLM_WORKER_LOST_AFTER_S": "20",
               "LEDGERLM_KAFKA_REPLICATION_FACTOR": str(REPLICAS),
               "LEDGERLM_AUDIT_SIGNING_KEY": "cluster-test-signing-key"}


def _events(log, topic) -> list:
    return [decode(record.value) for record in log.read_topic(topic.name)]


def _by_request(envelopes) -> dict[str, list]:
    found: dict[str, list] = defaultdict(list)
    for env in envelopes:
        found[env.correlation_id].append(env)
    return found


def _kinds(envelopes) -> list[str]:
    return [env.event_type for env in envelopes]


class Leaders:
    """Who leads the tenant's ledger partition (admission's reservations and settlements
    go there), asked of the nodes in `servers` only (not one that is cut off)."""

    def __init__(self, cluster: KafkaCluster, namespace: str, tenant_id: str):
        self.cluster, self.namespace = cluster, namespace
        self.topic = f"{namespace}.{topics.LEDGER.name}"
        self.partition = partition_for(tenant_id, topics.LEDGER.partitions)

    def _ask(self, servers: list[str], question):
        """`question(admin)` of the nodes in `servers`; None while they cannot say (a client
        may still try a node that has just been cut off, until the others fence it)."""
        try:
            admin = KafkaAdminClient(bootstrap_servers=servers, client_id="ledgerlm-cluster-test",
                                     request_timeout_ms=5000)
        except KafkaError:
            return None
        try:
            return question(admin)
        except KafkaError:
            return None
        finally:
            admin.close()

    def of_ledger(self, servers: list[str]) -> int | None:
        """The ledger partition's leader's node id, or None."""
        return self._ask(servers, lambda admin: self.cluster.leader_of(admin, self.topic, self.partition))

    def in_sync(self, servers: list[str]) -> set[int] | None:
        """The ledger partition's in-sync replicas, as the nodes in `servers` see them, or None."""
        def isr(admin) -> set[int]:
            (info,) = admin.describe_topics([self.topic])
            return next(set(p["isr_nodes"]) for p in info["partitions"] if p["partition_index"] == self.partition)
        return self._ask(servers, isr)

    def replicas(self) -> dict[str, set[int]]:
        """Each of the platform's topics: the replica counts of its partitions."""
        admin = KafkaAdminClient(bootstrap_servers=self.cluster.servers, client_id="ledgerlm-cluster-test")
        try:
            return {t["name"]: {len(p["replica_nodes"]) for p in t["partitions"]}
                    for t in admin.describe_topics() if t["name"].startswith(self.namespace + ".")}
        finally:
            admin.close()


def _others(cluster: KafkaCluster, node: int) -> list[str]:
    return [s for n, s in zip(cluster.nodes, cluster.servers) if n != node]


@pytest.mark.timing
@pytest.mark.timeout(480)  # 2-3 min here; two slow failovers must fail on their own deadlines, not this one
def test_the_platform_loses_nothing_when_one_node_of_three_is_killed_or_cut_off(tiny_model_dir, tmp_path,
                                                                                   monkeypatch):
    cluster, namespace = KafkaCluster(tmp_path / "cluster"), None
    try:
        cluster.start()
        monkeypatch.setenv("LEDGERLM_TEST_KAFKA", cluster.url)  # `deployed` runs on this cluster
        with deployed("kafka", tiny_model_dir, tmp_path / "deployed", max_seqs=4, take_ahead=0, stream_linger_ms=0,
                      environment=ENVIRONMENT) as platform, \
                Launched([sys.executable, "-m", "api.cli", "serve", "projector"], env=platform.env,
                         log=tmp_path / "projector.log", ready='"projector": "ready"', ready_s=120,
                         stop_s=30) as projector:
            namespace = platform.env["LEDGERLM_EVENT_LOG_NAMESPACE"]
            tenant_id, secret = platform.tenant()
            leaders = Leaders(cluster, namespace, tenant_id)
            made = leaders.replicas()
            assert made and all(counts == {REPLICAS} for counts in made.values()), made
            with httpx.Client(base_url=platform.base_url, timeout=30,
                              headers={"Authorization": f"Bearer {secret}"}) as client:
                wait_until(lambda: client.get("/v1/models").status_code == 200, 30, what="the API to know the key")
            traffic = Traffic(platform.base_url, secret).start()
            try:
                wait_until(lambda: traffic.succeeded_in("before"), 60, what="a generation before any failure")

                killed = wait_until(lambda: leaders.of_ledger(cluster.servers), 30, what="the ledger's leader")
                cluster.kill(killed)
                traffic.enter("killed")
                wait_until(lambda: traffic.succeeded_in("killed"), FAILOVER_S, every_s=0.2,
                           what=f"a generation begun after node {killed} was killed")
                cluster.restart(killed)
                traffic.enter("restarted")
                cluster.wait_fully_replicated(REJOIN_S, what=f"node {killed} back in every in-sync replica set")
                wait_until(lambda: traffic.succeeded_in("restarted"), FAILOVER_S, what="a generation after the restart")
                projector.check()

                cut = wait_until(lambda: leaders.of_ledger(cluster.servers), 30, what="the ledger's leader")
                cluster.cut(cut)
                traffic.enter("cut")
                # The others fence it, take over what it led and go on with two in sync
                # (min.insync.replicas). Clients find out as their requests to it time out
                # (30 s), so the platform is not asked to serve meanwhile.
                wait_until(lambda: leaders.of_ledger(_others(cluster, cut)) not in (None, cut), FAILOVER_S,
                           every_s=0.5, what=f"another node to lead the ledger partition node {cut} led")
                wait_until(lambda: cut not in (leaders.in_sync(_others(cluster, cut)) or {cut}), FAILOVER_S, every_s=0.5,
                           what=f"node {cut} out of the ledger partition's in-sync replicas")
                wait_until(lambda: traffic.outage_lasted("cut", 0), FAILOVER_S, every_s=0.2,
                           what="a request to meet the cut")
                cluster.reconnect(cut)
                traffic.enter("reconnected")
                cluster.wait_fully_replicated(REJOIN_S, what=f"node {cut} back in every in-sync replica set")
                wait_until(lambda: traffic.succeeded_in("reconnected"), FAILOVER_S,
                           what="a generation after the reconnect")
            finally:
                traffic.halt()
                print("phases began at (s):", [(p, round(t - traffic.entered[0][1], 1)) for p, t in traffic.entered])
                print({phase: dict(Counter((r["status"], r["code"]) for r in traffic.results if r["phase"] == phase))
                       for phase in dict(traffic.entered)})
            projector.check()
            cluster.check()
            results = traffic.results

            wrong = [r for r in results if not _answered_well(r)]
            assert not wrong, wrong
            ok = {client_request_id(tenant_id, r["request_id"]) for r in results
                  if (r["status"], r["code"]) == (200, "completed")}
            _assert_exactly_once(platform.log, ok)
            _assert_charged_once(platform.log, tmp_path / "deployed" / "ledgerlm.db", tenant_id)
    finally:
        cluster.close()
        if namespace:
            forget(namespace + ".")  # its topics went with the cluster: nothing to delete on the shared broker


def _answered_well(r: dict) -> bool:
    """Completed, or a 503 that says to come back (the request met a failover). A failover
    may also outlast a request's deadline (20 s), one begun before the failure included: it
    ends cancelled at the deadline (200), or as not started or finished in time (504, with
    the reason: `timeout`, `expired`)."""
    if r["status"] == 503:
        return r["code"] in OUTAGE_CODES and bool(r["retry_after"])
    return r["status"] == 504 or (r["status"], r["code"]) in {(200, "completed"), (200, "cancelled")}


def _assert_exactly_once(log, ok: set[str]) -> None:
    """Every acknowledged request's events are on the log once each; no event is there twice;
    every reservation is settled (completed, cancelled or expired) exactly once."""
    def settled_all():
        ledger = _by_request(_events(log, topics.LEDGER))
        open_ = [rid for rid, evs in ledger.items()
                 if "BudgetReserved" in _kinds(evs) and "UsageSettled" not in _kinds(evs)]
        return None if open_ else ledger
    ledger = wait_until(settled_all, 60, what="every reservation settled")
    requests, outcomes = _events(log, topics.REQUESTS), _events(log, topics.OUTCOMES)
    every = [(topics.LEDGER.name, env) for evs in ledger.values() for env in evs] + \
        [(topics.REQUESTS.name, env) for env in requests] + [(topics.OUTCOMES.name, env) for env in outcomes]
    counted = Counter(env.event_id for _, env in every)
    # The one event that may be there twice: the cancel the API appends for a request it
    # answered 503, retried until the log takes it (`api.outage.abandon`), so an append that
    # timed out yet landed is followed by its retry. Ending a request is done once whatever
    # asks for it, which the settlement checks below hold.
    twice = sorted({(topic, env.event_type, env.correlation_id, str(env.event_id))
                    for topic, env in every if counted[env.event_id] > 1
                    and not (env.event_type == "CancelRequested" and env.payload.reason == "client_gone")})
    assert not twice, f"events on the log more than once: {twice}"

    asked, ended = _by_request(requests), _by_request(outcomes)
    for rid in ok:
        kinds = _kinds(ledger.get(rid, []))
        assert _kinds(asked.get(rid, [])).count("GenerationRequested") == 1, (rid, _kinds(asked.get(rid, [])))
        assert kinds.count("BudgetReserved") == 1 and kinds.count("UsageSettled") == 1, (rid, kinds)
        assert _kinds(ended.get(rid, [])).count("GenerationCompleted") == 1, (rid, _kinds(ended.get(rid, [])))
        (requested,) = [e.payload for e in asked[rid] if e.event_type == "GenerationRequested"]
        (settled,) = [e.payload for e in ledger[rid] if e.event_type == "UsageSettled"]
        assert (settled.terminal_status, settled.input_tokens, settled.output_tokens) == \
            ("completed", requested.input_tokens, OUTPUT_TOKENS), (rid, settled)
    doubled = {rid: _kinds(evs) for rid, evs in ledger.items()
               if any(_kinds(evs).count(kind) > 1 for kind in ("BudgetReserved", "UsageSettled", "ReservationReleased"))}
    assert not doubled, doubled


def _assert_charged_once(log, db_path, tenant_id: str) -> None:
    """The projector, on the cluster through both failures, charges every settlement once,
    exactly what the log settled: the tenant's totals agree to the token and the micro."""
    settled = {e.correlation_id: e.payload for e in _events(log, topics.LEDGER) if e.event_type == "UsageSettled"}

    def projected():
        if not db_path.exists():
            return None
        with sqlite3.connect(db_path) as db:
            rows = db.execute("SELECT source_id, input_tokens, output_tokens, cost_micros FROM usage_ledger "
                              "WHERE source = 'generation' AND tenant_id = ?", (tenant_id,)).fetchall()
        return rows if set(settled) <= {row[0] for row in rows} else None
    rows = wait_until(projected, 60, what="the projector to catch up")
    counted = Counter(row[0] for row in rows)
    assert all(n == 1 for n in counted.values()), {rid: n for rid, n in counted.items() if n > 1}
    assert {row[0]: tuple(row[1:]) for row in rows} == {
        rid: (s.input_tokens, s.output_tokens, s.cost_micros) for rid, s in settled.items()}
    totals = [sum(row[i] for row in rows) for i in (1, 2, 3)]
    assert totals == [sum(s.input_tokens for s in settled.values()), sum(s.output_tokens for s in settled.values()),
                      sum(s.cost_micros for s in settled.values())] and totals[1] > 0, totals
