"""What fleet status shows, from fleet events folded at known times: each worker's state,
capacity, load and heartbeat age, the summary per (pool, revision) over the workers taking
work, the filters, and the table. Also: the Prometheus scrape config parses."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from api.cli.fleet import table
from api.fleet_report import fleet_report
from models.events_fleet import Capacity, WorkerDraining, WorkerHeartbeat, WorkerJoined, WorkerLeft
from models.fleet import FleetState

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
ROOT = Path(__file__).resolve().parents[2]


def who(worker_id: str) -> dict:
    """Workers named b... serve rev-b, the others rev-a; all in one pool, beating each second."""
    revision = "rev-b" if worker_id.startswith("b") else "rev-a"
    return dict(worker_id=worker_id, pool="interactive", model_revision=revision,
                engine_config_hash=f"hash-{revision}", host="h1", pid=7, heartbeat_interval_ms=1000,
                capacity=Capacity(max_seqs=8, kv_cache_tokens=4096, max_model_len=512))


def beat(state: FleetState, worker_id: str, at_s: float, seq: int, **load) -> None:
    values = dict(running=2, waiting=1, free_slots=6, kv_cache_usage=0.25, output_tokens_per_s=40.0) | load
    state.apply(WorkerHeartbeat(**who(worker_id), seq=seq, **values), T0 + timedelta(seconds=at_s))


def fleet() -> FleetState:
    """At T0+10s: a1, a2 live on rev-a, a3 draining, a4 silent since 5s (lost), a5 left;
    b1 live on rev-b."""
    state = FleetState()
    for worker_id in ("a1", "a2", "a3", "a4", "a5", "b1"):
        state.apply(WorkerJoined(**who(worker_id)), T0)
    for worker_id in ("a1", "a2", "a3", "b1"):
        beat(state, worker_id, 9.5, seq=0)
    beat(state, "a4", 5, seq=0)
    state.apply(WorkerDraining(worker_id="a3", reason="deploy"), T0 + timedelta(seconds=9.6))
    state.apply(WorkerLeft(worker_id="a5", reason="shutdown", exit_code=0), T0 + timedelta(seconds=4))
    return state


def test_every_worker_is_shown_with_its_state_capacity_load_and_heartbeat_age():
    report = fleet_report(fleet().all(), T0 + timedelta(seconds=10))
    by_id = {w.worker_id: w for w in report.workers}
    assert [w.worker_id for w in report.workers] == ["a1", "a2", "a3", "a4", "a5", "b1"]
    assert {i: w.status for i, w in by_id.items()} == {
        "a1": "live", "a2": "live", "a3": "draining", "a4": "lost", "a5": "left", "b1": "live"}
    a1 = by_id["a1"]
    assert (a1.model_revision, a1.engine_config_hash, a1.host, a1.pid) == ("rev-a", "hash-rev-a", "h1", 7)
    assert (a1.capacity.max_seqs, a1.capacity.kv_cache_tokens, a1.capacity.max_model_len) == (8, 4096, 512)
    assert (a1.load.running, a1.load.waiting, a1.load.free_slots) == (2, 1, 6)
    assert (a1.load.kv_cache_usage, a1.load.output_tokens_per_s) == (0.25, 40.0)
    assert a1.last_heartbeat_at == T0 + timedelta(seconds=9.5) and a1.last_heartbeat_age_s == 0.5
    assert by_id["a4"].last_heartbeat_age_s == 5.0
    assert by_id["a3"].drain_reason == "deploy"
    assert (by_id["a5"].left_reason, by_id["a5"].exit_code) == ("shutdown", 0)
    assert by_id["a5"].left_at == T0 + timedelta(seconds=4)


def test_the_summary_per_pool_and_revision_counts_only_workers_taking_work():
    report = fleet_report(fleet().all(), T0 + timedelta(seconds=10))
    pools = {(p.pool, p.model_revision): p for p in report.pools}
    assert set(pools) == {("interactive", "rev-a"), ("interactive", "rev-b")}
    a = pools["interactive", "rev-a"]
    assert (a.workers, a.free_slots, a.max_seqs, a.kv_cache_tokens, a.running, a.waiting) == (2, 12, 16, 8192, 4, 2)
    assert a.output_tokens_per_s == 80.0
    assert a.by_status == {"live": 2, "draining": 1, "lost": 1, "left": 1}
    assert pools["interactive", "rev-b"].workers == 1


def test_a_worker_goes_lost_by_the_clock_alone_and_lost_after_can_be_told():
    state = fleet()
    later = fleet_report(state.all(), T0 + timedelta(seconds=13))
    assert {w.worker_id for w in later.workers if w.status == "lost"} == {"a1", "a2", "a3", "a4", "b1"}
    assert all(p.workers == 0 for p in later.pools)
    patient = fleet_report(state.all(), T0 + timedelta(seconds=13), lost_after_s=30)
    assert {w.worker_id for w in patient.workers if w.status == "lost"} == set()


def test_filters_by_pool_and_revision():
    state = fleet()
    now = T0 + timedelta(seconds=10)
    assert [w.worker_id for w in fleet_report(state.all(), now, revision="rev-b").workers] == ["b1"]
    assert fleet_report(state.all(), now, pool="batch").workers == []


def test_the_table_has_a_line_per_worker_and_per_pool():
    text = table(fleet_report(fleet().all(), T0 + timedelta(seconds=10)))
    lines = text.splitlines()
    a4 = next(line for line in lines if line.startswith("a4 "))
    assert "lost" in a4 and "rev-a" in a4 and "(5.0s ago)" in a4
    rev_a = next(line for line in lines if line.startswith("interactive") and "rev-a" in line)
    assert rev_a.split()[2:4] == ["2", "12"] and "1 draining, 1 lost, 1 left" in rev_a
    assert "(no workers heard from)" in table(fleet_report([], T0))


def test_the_prometheus_scrape_config_parses_and_scrapes_the_api():
    config = yaml.safe_load((ROOT / "infra" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert "ledgerlm-api" in jobs
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in jobs.values())
