"""What fleet status shows, from fleet events folded at known times: each worker's state,
capacity, load and heartbeat age, the summary per (pool, revision) over the workers taking
work, the filters, and the table. Also: the Prometheus scrape config parses."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from api.cli.fleet import NAME_CAP, table
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
    assert rev_a.split()[2:4] == ["2", "16"] and "1 draining, 1 lost, 1 left" in rev_a  # SERVING, SEQS
    assert "(no workers heard from)" in table(fleet_report([], T0))


def test_the_prometheus_scrape_config_parses_and_scrapes_the_api():
    config = yaml.safe_load((ROOT / "infra" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert "ledgerlm-api" in jobs
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in jobs.values())


def _columns(head: str, line: str, names: tuple[str, ...]) -> list[str]:
    """The figures of `line` under the named (right-aligned) columns of `head`."""
    return [line[:head.index(name) + len(name)].split()[-1] for name in names]


def slots(free_slots: int, running: int, waiting: int = 0) -> FleetState:
    """One worker of 16 sequences (a take-ahead of 16: 32 slots in all) at T0+1s."""
    state = FleetState()
    identity = who("a1") | {"capacity": Capacity(max_seqs=16, kv_cache_tokens=4096, max_model_len=512)}
    state.apply(WorkerHeartbeat(**identity, seq=0, running=running, waiting=waiting, free_slots=free_slots,
                                kv_cache_usage=0.0, output_tokens_per_s=0.0), T0 + timedelta(seconds=1))
    return state


def test_free_slots_are_split_into_the_engines_and_the_take_ahead_room():
    idle = fleet_report(slots(free_slots=32, running=0).all(), T0 + timedelta(seconds=1))
    [w], [p] = idle.workers, idle.pools
    assert (w.load.free_slots, w.load.engine_slots_free, w.load.take_ahead_free) == (32, 16, 16)
    assert (p.free_slots, p.engine_slots_free, p.take_ahead_free, p.max_seqs) == (32, 16, 16, 16)
    # 20 taken: the engine's 16 all run, 4 wait inside it, 12 places of take-ahead are left.
    busy = fleet_report(slots(free_slots=12, running=16, waiting=4).all(), T0 + timedelta(seconds=1))
    assert (busy.workers[0].load.engine_slots_free, busy.workers[0].load.take_ahead_free) == (0, 12)
    some = fleet_report(slots(free_slots=22, running=10).all(), T0 + timedelta(seconds=1))
    assert (some.pools[0].engine_slots_free, some.pools[0].take_ahead_free) == (6, 16)
    as_json = idle.model_dump(mode="json")
    assert as_json["workers"][0]["load"]["free_slots"] == 32, "the field clients read is kept as it was"
    assert as_json["pools"][0]["take_ahead_free"] == 16


def test_a_lost_pool_counts_no_free_slots_of_either_kind():
    report = fleet_report(slots(free_slots=32, running=0).all(), T0 + timedelta(seconds=60))
    assert report.workers[0].status == "lost"
    assert (report.pools[0].engine_slots_free, report.pools[0].take_ahead_free) == (0, 0)


def test_the_table_shows_free_engine_slots_and_take_ahead_apart_with_a_legend():
    text = table(fleet_report(slots(free_slots=32, running=0).all(), T0 + timedelta(seconds=1)))
    lines = text.splitlines()
    head = lines[1]
    a1 = next(line for line in lines if line.startswith("a1 "))
    assert _columns(head, a1, ("SEQS", "RUNNING", "FREE", "AHEAD")) == ["16", "0", "16", "16"]
    pool_head = next(line for line in lines if line.startswith("POOL"))
    pool_row = lines[lines.index(pool_head) + 1]
    assert _columns(pool_head, pool_row, ("SEQS", "FREE", "AHEAD")) == ["16", "16", "16"]
    legend = {line.split()[0]: line for line in lines if line[:1].isupper() and "  " in line[:10]}
    assert "engine slots free" in legend["FREE"] and "take-ahead" in legend["AHEAD"].lower()
    assert "free_slots" in text and "LEDGERLM_WORKER_TAKE_AHEAD" in text


def test_lost_after_is_the_platforms_setting_judged_as_admission_judges_it():
    state = FleetState()
    slow = who("s1") | {"heartbeat_interval_ms": 3000}  # three intervals (9 s) outlast the setting
    state.apply(WorkerJoined(**who("a1")), T0)
    state.apply(WorkerJoined(**slow), T0)
    at_7s = fleet_report(state.all(), T0 + timedelta(seconds=7), 5.0)
    assert at_7s.lost_after_s == 5.0
    assert {w.worker_id: (w.status, w.lost_after_s) for w in at_7s.workers} == {
        "a1": ("lost", 5.0), "s1": ("live", 9.0)}
    at_4s = fleet_report(state.all(), T0 + timedelta(seconds=4), 5.0)
    assert [w.status for w in at_4s.workers] == ["live", "live"], "three 1 s beats missed is not lost at 5 s"
    assert fleet_report(state.all(), T0 + timedelta(seconds=4)).workers[0].status == "lost"  # none given: 3 beats
    assert "lost after 5s of silence" in table(at_7s).splitlines()[0]


def test_the_fleet_route_judges_by_the_settings_lost_after():
    import asyncio
    from types import SimpleNamespace

    from api.routes.fleet import fleet as fleet_route

    state = fleet()
    view = SimpleNamespace(all=state.all, lost_after_s=None)
    svc = SimpleNamespace(fleet=view, settings=SimpleNamespace(worker_lost_after_s=7.5))
    answer = asyncio.run(fleet_route(svc, None))
    assert answer.lost_after_s == 7.5 and answer.model_dump(mode="json")["lost_after_s"] == 7.5
    assert {w.lost_after_s for w in answer.workers} == {7.5}


def test_the_console_fleet_page_shows_the_split_and_the_lost_rule():
    import re

    from jinja2 import ChoiceLoader, DictLoader

    from api.console.render import environment

    console = environment()
    fleet_only = console.overlay(loader=ChoiceLoader([DictLoader({"fleet_slo.html": ""}), console.loader]))
    report = fleet_report(slots(free_slots=22, running=10).all(), T0 + timedelta(seconds=1), 5.0)
    html = fleet_only.get_template("fleet.html").render(user=None, report=report)
    pools, workers = html.split('id="workers"')
    for part in (pools, workers):
        assert re.findall(r'class="num engine-free">(\d+)<', part) == ["6"]
        assert re.findall(r'class="num take-ahead">(\d+)<', part) == ["16"]
    assert "Engine slots free" in pools and "Take-ahead room" in pools
    assert "lost after 5.0 s without a heartbeat" in html and "GiB" in html


def long_names() -> FleetState:
    state = FleetState()
    for worker_id, revision in (("w1", "org/a-very-long-model-name-instruct@" + "0123456789abcdef" * 2),
                                ("w2", "tiny@r1")):
        identity = who(worker_id) | {"model_revision": revision}
        state.apply(WorkerHeartbeat(**identity, seq=0, running=1, waiting=0, free_slots=15,
                                    kv_cache_usage=0.1, output_tokens_per_s=2.0), T0 + timedelta(seconds=1))
    return state


def _aligned(lines: list[str], head: str) -> None:
    """Every row's cells sit under the header's columns: each right-aligned figure ends where
    its column's name ends, and the STATE column starts where its name does."""
    for line in lines:
        for name in ("SEQS", "RUNNING", "FREE", "AHEAD", "KV TOKENS"):
            end = head.index(name) + len(name)
            assert line[end - 1] != " " and line[end] == " ", (name, line)
        assert line[head.index("STATE"):].startswith("live"), line


def test_long_revision_names_are_cut_and_keep_the_columns_aligned():
    report = fleet_report(long_names().all(), T0 + timedelta(seconds=1))
    lines = table(report).splitlines()
    head, rows = lines[1], lines[2:4]
    _aligned(rows, head)
    long_revision = report.workers[0].model_revision
    assert long_revision not in "\n".join(lines) and long_revision[:NAME_CAP - 1] + "…" in rows[0]
    assert any("--wide" in line for line in lines)
    pool_rows = [line for line in lines if line.startswith("interactive")]
    assert len(pool_rows) == 2 and all(len(r.split("  ")[0]) <= NAME_CAP for r in pool_rows)


def test_wide_shows_long_names_whole_in_aligned_columns():
    report = fleet_report(long_names().all(), T0 + timedelta(seconds=1))
    lines = table(report, wide=True).splitlines()
    head, rows = lines[1], lines[2:4]
    _aligned(rows, head)
    assert report.workers[0].model_revision in rows[0] and "…" not in "\n".join(lines)
    assert not any("--wide" in line for line in lines)


def test_the_fleet_status_command_takes_wide_and_refuses_a_bad_lost_after(capsys):
    import argparse

    import pytest

    from api.cli.fleet import register

    parser = argparse.ArgumentParser(prog="ledgerlm")
    register(parser.add_subparsers())
    assert parser.parse_args(["fleet", "status", "--wide"]).wide is True
    assert parser.parse_args(["fleet", "status"]).lost_after is None  # the settings' then
    with pytest.raises(SystemExit) as refused:
        parser.parse_args(["fleet", "status", "--lost-after", "-1"])
    assert refused.value.code == 2 and "not a positive number of seconds" in capsys.readouterr().err


FLEET_SOURCES = ("api/fleet_report.py", "api/cli/fleet.py", "api/routes/fleet.py", "pipelines/fleet.py",
                 "models/fleet.py", "api/console/templates/fleet.html")


def test_kv_figures_are_tokens_and_the_cache_size_is_named_in_gib():
    # No fleet figure is converted with decimal gigabytes (the capacity plan's GB is its own).
    for name in FLEET_SOURCES:
        text = (ROOT / name).read_text()
        assert not any(decimal in text for decimal in ("1e9", "10**9", "10 ** 9", "1_000_000_000", "capacity_plan")), name
    text = table(fleet_report(fleet().all(), T0 + timedelta(seconds=10)))
    assert "KV TOKENS" in text and "in tokens" in text and "LEDGERLM_KV_CACHE_GB, in GiB" in text
    assert "GiB" in (ROOT / "docs" / "metrics.md").read_text()
