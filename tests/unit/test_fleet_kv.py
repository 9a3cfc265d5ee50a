"""Workers' KV figures where operators read them: the fleet report (per worker, and summed
per pool and revision over the workers taking work), the `fleet status` table with its
columns aligned, the console's Fleet page, the API's fleet gauges and a worker's own
metrics. Heartbeats folded at known times; stand-in engines for the worker's metrics."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from jinja2 import ChoiceLoader, DictLoader
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.cli.fleet import table
from api.console.render import environment
from api.fleet_report import fleet_report
from api.metrics import ApiMetrics
from models.events_fleet import Capacity, WorkerHeartbeat, WorkerJoined
from models.fleet import FleetState
from tests.fake_engine import FakeEngine
from workers.engine_stats import EngineStats
from workers.metrics import worker_metrics

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
NOW = T0 + timedelta(seconds=10)
KV = {"a1": (4096, 1024, 3, 800, 200), "a2": (4096, 512, 0, 0, 0), "a3": (8192, 4096, 5, 100, 100)}


def who(worker_id: str) -> dict:
    return dict(worker_id=worker_id, pool="interactive", model_revision="rev-a", engine_config_hash="h", host="h1",
                pid=7, heartbeat_interval_ms=1000,
                capacity=Capacity(max_seqs=8, kv_cache_tokens=KV[worker_id][0], max_model_len=512))


def fleet() -> FleetState:
    """a1 and a2 beat at 9.5 s; a3 went silent at 2 s (lost by 10 s)."""
    state = FleetState()
    for worker_id, at in (("a1", 9.5), ("a2", 9.5), ("a3", 2.0)):
        capacity, used, preemptions, queries, hits = KV[worker_id]
        state.apply(WorkerJoined(**who(worker_id)), T0)
        state.apply(WorkerHeartbeat(**who(worker_id), seq=0, running=1, waiting=0, free_slots=7,
                                    kv_cache_usage=used / capacity, output_tokens_per_s=1.0, kv_tokens_used=used,
                                    preemptions=preemptions, prefix_cache_queries=queries, prefix_cache_hits=hits),
                    T0 + timedelta(seconds=at))
    return state


def test_the_report_shows_each_workers_kv_figures_and_sums_those_taking_work():
    report = fleet_report(fleet().all(), NOW)
    a1 = next(w for w in report.workers if w.worker_id == "a1")
    assert a1.capacity.kv_cache_tokens == 4096
    assert (a1.load.kv_tokens_used, a1.load.kv_cache_usage, a1.load.preemptions) == (1024, 0.25, 3)
    assert (a1.load.prefix_cache_queries, a1.load.prefix_cache_hits) == (800, 200)
    [pool] = report.pools
    # a3 is lost: its last heartbeat's figures are shown on its row, not summed.
    assert (pool.workers, pool.kv_cache_tokens, pool.kv_tokens_used, pool.preemptions) == (2, 8192, 1536, 3)
    assert (pool.prefix_cache_queries, pool.prefix_cache_hits) == (800, 200)
    assert report.model_dump(mode="json")["workers"][0]["load"]["kv_tokens_used"] == 1024


def _cell(header: str, line: str, name: str) -> str:
    """The text under a right-aligned column of the table: from the end of the previous
    column's name to the end of this one's."""
    end = header.index(name) + len(name)
    start = header.rindex(" ", 0, header.index(name)) if header.index(name) else 0
    start = len(header[:start].rstrip())
    return line[start:end].strip()


def test_the_table_shows_kv_used_preemptions_and_hit_rate_in_aligned_columns():
    lines = table(fleet_report(fleet().all(), NOW)).splitlines()
    head = lines[1]
    rows = {line.split()[0]: line for line in lines[2:5]}
    assert [_cell(head, rows["a1"], n) for n in ("KV TOKENS", "KV USED", "KV%", "PREEMPT", "HIT%")] == \
        ["4096", "1024", "25%", "3", "25%"]
    assert [_cell(head, rows["a2"], n) for n in ("KV USED", "PREEMPT", "HIT%")] == ["512", "0", "-"]
    pool_head = next(line for line in lines if line.startswith("POOL"))
    pool_row = lines[lines.index(pool_head) + 1]
    assert [_cell(pool_head, pool_row, n) for n in ("SERVING", "KV TOKENS", "KV USED", "PREEMPT", "HIT%")] == \
        ["2", "8192", "1536", "3", "25%"]
    assert pool_row.endswith("1 lost")


def test_the_console_fleet_page_shows_kv_capacity_and_use():
    # The page's service-level section reads the projections: left out here.
    console = environment()
    fleet_only = console.overlay(loader=ChoiceLoader([DictLoader({"fleet_slo.html": ""}), console.loader]))
    html = fleet_only.get_template("fleet.html").render(user=None, report=fleet_report(fleet().all(), NOW))
    pools, workers = html.split('id="workers"')
    assert re.findall(r'class="num kv-capacity">([\d,]+)<', pools) == ["8,192"]
    assert re.findall(r'class="num kv-used">([\d,]+)<', pools) == ["1,536"]
    assert re.findall(r'class="num kv-used">([\d,]+)<', workers) == ["1,024", "512", "4,096"]
    assert "25.0 %" in workers  # a1's prefix-cache hits, of 800 tokens looked up


def samples(registry) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode()) for s in family.samples}


def test_the_api_exports_kv_capacity_and_use_per_pool_and_revision():
    state = fleet()
    metrics = ApiMetrics()
    metrics.fleet = SimpleNamespace(live=lambda: state.live(NOW), lost=lambda: state.lost(NOW),
                                    capacity=lambda: state.capacity(NOW))
    found = samples(metrics.registry)
    key = (("pool", "interactive"), ("revision", "rev-a"))
    assert found[("ledgerlm_fleet_kv_cache_tokens", key)] == 8192
    assert found[("ledgerlm_fleet_kv_cache_used_tokens", key)] == 1536


def _worker(engine) -> SimpleNamespace:
    return SimpleNamespace(pool="interactive", revision="rev-a", engine=engine, in_flight=1, capacity=2,
                           output_tokens=0, queued_work=lambda: [])


def test_a_worker_exports_its_engines_kv_cache_in_tokens_when_the_engine_says():
    engine = FakeEngine(hold=True, kv_tokens=2048, block_size=16)
    engine.kv.hold("r1", 40)
    found = samples(worker_metrics(_worker(engine)))
    mine = (("pool", "interactive"), ("revision", "rev-a"))
    assert found[("ledgerlm_engine_kv_cache_tokens", mine)] == 2048
    assert found[("ledgerlm_engine_kv_cache_used_tokens", mine)] == 48
    silent = samples(worker_metrics(_worker(FakeEngine(hold=False))))
    assert not any(name.startswith("ledgerlm_engine_kv_cache") for name, _ in silent)


def test_a_vllm_style_worker_exports_preemptions_and_prefix_cache_totals():
    engine = FakeEngine(hold=False)
    engine.stats = EngineStats()
    engine.stats.preemptions = 2
    engine.stats.prefix_cache_queries, engine.stats.prefix_cache_hits = 640, 160
    found = samples(worker_metrics(_worker(engine)))
    mine = (("pool", "interactive"), ("revision", "rev-a"))
    assert found[("ledgerlm_engine_preemptions_total", mine)] == 2
    assert found[("ledgerlm_engine_prefix_cache_queries_total", mine)] == 640
    assert found[("ledgerlm_engine_prefix_cache_hits_total", mine)] == 160
