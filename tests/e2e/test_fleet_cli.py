"""`ledgerlm fleet status` on both logs: workers announced on the fleet topic by their
presences show up, read by a separate process, with their revision, capacity, load and
state: one beating (live), one that went silent (lost), one that left."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from api.fleet_report import fleet_report
from models.events_fleet import Capacity
from pipelines.fleet import FleetView, wall_clock
from tests.conftest import make_log_opener
from tests.helpers import wait_until
from workers.fleet_presence import FleetPresence, Load, WorkerIdentity

ROOT = Path(__file__).resolve().parents[2]
INTERVAL_S = 0.25
CAP = Capacity(max_seqs=6, kv_cache_tokens=12288, max_model_len=2048)
LOAD = Load(running=2, waiting=3, free_slots=4, kv_cache_usage=0.5, output_tokens_per_s=12.5, kv_tokens_used=6144,
            preemptions=1, prefix_cache_queries=400, prefix_cache_hits=100)


def ledgerlm(settings, *args: str, lost_after_s: str = "0.5") -> subprocess.CompletedProcess:
    """The command as an operator runs it, with the platform's lost-after setting (shorter
    than the default, so a silenced worker is lost within this test)."""
    env = {**os.environ, "LEDGERLM_HOME": str(settings.home), "LEDGERLM_EVENT_LOG_URL": settings.event_log_url,
           "LEDGERLM_EVENT_LOG_NAMESPACE": settings.event_log_namespace, "LEDGERLM_WORKER_LOST_AFTER_S": lost_after_s}
    result = subprocess.run([sys.executable, "-m", "api.cli", "fleet", *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.parametrize("kind", ["embedded", "kafka"])
def test_fleet_status_shows_live_lost_and_left_workers(kind, tmp_path):
    opener = make_log_opener(kind, tmp_path)
    revision, tag = f"rev-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:6]
    presences, logs = {}, []
    for name in ("live", "silent", "gone"):
        log = opener()
        logs.append(log)
        identity = WorkerIdentity(worker_id=f"{name}-{tag}", pool="interactive", model_revision=revision,
                                  engine_config_hash="cfg-hash", capacity=CAP)
        presences[name] = FleetPresence(log, identity, lambda: LOAD, interval_s=INTERVAL_S)
        presences[name].start()
    try:
        presences["silent"].beat()
        presences["silent"].silence()
        presences["gone"].close("shutdown", exit_code=0)
        # What the command should find: another reader sees all three as they now stand.
        with opener() as reader, FleetView(reader) as view:
            wait_until(lambda: view.refresh() and {w.worker_id for w in view.lost()} == {f"silent-{tag}"}
                       and {w.worker_id for w in view.live()} == {f"live-{tag}"}, 30,
                       what="the view to see one live and one lost worker")

        report = json.loads(ledgerlm(opener.settings, "status", "--json").stdout)
        workers = {w["worker_id"]: w for w in report["workers"]}
        assert set(workers) == {f"live-{tag}", f"silent-{tag}", f"gone-{tag}"}
        live, silent, gone = (workers[f"{name}-{tag}"] for name in ("live", "silent", "gone"))
        assert (live["status"], silent["status"], gone["status"]) == ("live", "lost", "left")
        assert live["model_revision"] == revision and live["engine_config_hash"] == "cfg-hash"
        assert live["capacity"] == {"max_seqs": 6, "kv_cache_tokens": 12288, "max_model_len": 2048}
        assert live["load"] == {"running": 2, "waiting": 3, "free_slots": 4, "kv_cache_usage": 0.5,
                                "output_tokens_per_s": 12.5, "kv_tokens_used": 6144, "preemptions": 1,
                                "prefix_cache_queries": 400, "prefix_cache_hits": 100,
                                "engine_slots_free": 4, "take_ahead_free": 0}
        # The setting (0.5 s) judges, but never less than three 0.25 s heartbeat intervals.
        assert report["lost_after_s"] == 0.5 and live["lost_after_s"] == 0.75
        assert live["last_heartbeat_age_s"] < 10 and live["heartbeat_interval_ms"] == 250
        assert silent["last_heartbeat_age_s"] > 3 * INTERVAL_S
        assert (gone["left_reason"], gone["exit_code"]) == ("shutdown", 0)
        [pool] = report["pools"]
        assert (pool["pool"], pool["model_revision"], pool["workers"], pool["free_slots"], pool["max_seqs"]) == \
            ("interactive", revision, 1, 4, 6)
        assert (pool["kv_cache_tokens"], pool["kv_tokens_used"]) == (12288, 6144)
        assert pool["by_status"] == {"live": 1, "draining": 0, "lost": 1, "left": 1}

        text = ledgerlm(opener.settings, "status", "--revision", revision).stdout
        rows = [line.split() for line in text.splitlines() if line.endswith("ago)")]
        states = {row[0]: row[4] for row in rows}
        assert states == {f"live-{tag}": "live", f"silent-{tag}": "lost", f"gone-{tag}": "left"}
        live_row = next(row for row in rows if row[0] == f"live-{tag}")
        assert live_row[5:12] == ["6", "2", "3", "4", "0", "12288", "6144"]  # SEQS .. FREE, AHEAD, KV TOKENS, KV USED
        assert json.loads(ledgerlm(opener.settings, "status", "--json", "--pool", "other").stdout)["workers"] == []
        told = json.loads(ledgerlm(opener.settings, "status", "--json", "--lost-after", "30", lost_after_s="2").stdout)
        assert told["lost_after_s"] == 30 and {w["worker_id"]: w["status"] for w in told["workers"]}[f"silent-{tag}"] \
            == "live", "--lost-after overrides the setting"
        assert json.loads(ledgerlm(opener.settings, "status", "--json", lost_after_s="2").stdout)["lost_after_s"] == 2
    finally:
        for presence in presences.values():
            presence.silence()
        for log in logs:
            log.close()


@pytest.mark.parametrize("kind", ["embedded", "kafka"])
def test_a_view_reaching_back_shows_workers_silent_or_gone_before_its_window(kind, tmp_path):
    """What `--since` relies on: read a minute later (a clock ahead), the default window holds
    nothing of two workers, one that went silent and one that left; a view reaching back
    two minutes shows them lost and left."""
    opener = make_log_opener(kind, tmp_path)
    log = opener()
    identity = dict(pool="interactive", model_revision="rev-x", engine_config_hash="h", capacity=CAP)
    silent = FleetPresence(log, WorkerIdentity(worker_id="silent", **identity), lambda: LOAD, interval_s=1.0)
    gone = FleetPresence(log, WorkerIdentity(worker_id="gone", **identity), lambda: LOAD, interval_s=1.0)
    try:
        for presence in (silent, gone):
            presence.start()
            presence.beat()
        silent.silence()
        gone.close("scaled-in", exit_code=0)
        a_minute_on = lambda: wall_clock() + timedelta(seconds=60)  # noqa: E731
        with opener() as reader, FleetView(reader, clock=a_minute_on) as narrow:
            assert narrow.refresh().all() == []
        with opener() as reader, FleetView(reader, clock=a_minute_on, look_back_s=120, max_read_s=15) as wide:
            report = fleet_report(wide.refresh().all(), a_minute_on(), wide.lost_after_s)
        assert {w.worker_id: w.status for w in report.workers} == {"silent": "lost", "gone": "left"}
        assert all(w.last_heartbeat_age_s >= 60 for w in report.workers)
    finally:
        log.close()
