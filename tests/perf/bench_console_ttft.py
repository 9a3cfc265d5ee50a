"""Serving TTFT while the web console is used: the console's goal of no more than 5 % on
the p95 of time to first token.

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/bench_console_ttft.py [--rate 8] [--duration-s 30] [--rounds 3]
    .venv/bin/python tests/perf/bench_console_ttft.py --duration-s 3 --rounds 1 --no-record   # a quick check

One platform in this process (`tests.harness.Platform` on the embedded log): admission, a
worker of `--slots` slots on a stand-in engine that emits a token every `--token-ms`, the
API with its console, and a projector (`ProjectionRunner.run` in a thread, as `serve
projector` runs it) into a fresh database on the PostgreSQL of `.local/services.env`,
migrated first. Three tenants, each with a tenant admin key and two application keys, get
`--seed` generations between them, projected before anything is measured, so the pages
have rows to show and a second page of generations.

Serving load: streamed generations (`POST /v1/generations`, `--output-tokens` tokens), open
loop at `--rate` a second for `--duration-s`, from the three tenants in turn; TTFT is the
client's time from sending to the first `tokens` event. Two kinds of phase on the same
platform:

- A: the serving load alone;
- B: the same load while `--console-users` people use the console from another process
  (a browser is not in the API's process): each signs in (the first with an operator key,
  the others as tenant admins), then loads page after page with `--think-s` between them:
  usage over the last year grouped per tenant or per key, the generations list and its
  next page, limits, keys, audit, and for the operator fleet; and one CSV export of the
  year, once a phase, at a time of its own within the phase.

Phases run A, B, A, B, ..., A (`--rounds` B phases between A phases), so a drift of the
machine's load shows in the A phases around each B. Reported: TTFT p50/p95/p99 of each
phase, console page latency p50/p95 and pages served in each B phase, each B's p95 over
the mean p95 of the A phases either side, and the pooled p95 of every B sample over that of
every A sample. Appends to the "Web console: serving while it is used" section of
tests/perf/RESULTS.md (`--no-record` to leave it).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shlex
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from tests.perf.open_loop import open_loop  # noqa: E402
from tests.perf.results import record_run  # noqa: E402  (light: the console users' process imports this module)

SECTION = "## Web console: serving while it is used"
NEXT_PAGE = re.compile(r'href="([^"]+)" id="next-page"')


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else float("nan")


# -- the console users: run in a process of their own --------------------------------------

def user_pages(user: dict, start: str, end: str) -> list[tuple[str, str]]:
    """(label, path) of the pages one user loads in turn; `next` follows the generations
    list's link to its next page."""
    year = f"start={start}&end={end}"
    if user["operator"]:
        t = user["tenant_id"]  # the tenant the operator looks into
        return [("usage, every tenant, a year, per tenant", f"/console/usage?{year}"),
                ("usage, one tenant, a year, per key", f"/console/usage?tenant={t}&{year}&group=key"),
                ("generations, first page", "/console/generations"),
                ("generations, next page", "next"),
                ("limits", f"/console/limits?tenant={t}"),
                ("keys", f"/console/keys?tenant={t}"),
                ("fleet", "/console/fleet"),
                ("audit, first page", "/console/audit")]
    return [("usage, own tenant, a year, per key", f"/console/usage?{year}&group=key"),
            ("generations, first page", "/console/generations"),
            ("generations, next page", "next"),
            ("limits", "/console/limits"),
            ("keys", "/console/keys"),
            ("audit, first page", "/console/audit")]


def one_user(base_url: str, user: dict, start: str, end: str, think_s: float, export_at_s: float,
             signed_in: threading.Barrier, begin: threading.Event, stop, pages: list, exports: list,
             lock: threading.Lock) -> None:
    try:
        _one_user(base_url, user, start, end, think_s, export_at_s, signed_in, begin, stop, pages, exports, lock)
    except BaseException:
        signed_in.abort()  # the others, and the process, stop waiting for this one
        raise


def _one_user(base_url: str, user: dict, start: str, end: str, think_s: float, export_at_s: float,
              signed_in: threading.Barrier, begin: threading.Event, stop, pages: list, exports: list,
              lock: threading.Lock) -> None:
    with httpx.Client(base_url=base_url, timeout=120, follow_redirects=False) as client:
        answer = client.post("/console/login", data={"api_key": user["secret"]})
        assert answer.status_code == 303, answer.text[:300]
        for _, path in user_pages(user, start, end):  # warm: templates compiled, plans cached
            if path != "next":
                client.get(path)
        signed_in.wait()
        begin.wait()
        began, exported, next_path = time.perf_counter(), False, None
        while not stop.is_set():
            for label, path in user_pages(user, start, end):
                if stop.is_set():
                    break
                if not exported and time.perf_counter() - began >= export_at_s:
                    exported = True
                    sent = time.perf_counter()
                    response = client.get(f"/console/usage/export?format=csv&start={start}&end={end}")
                    with lock:
                        exports.append(((time.perf_counter() - sent) * 1000, response.status_code,
                                        response.text.count("\n") - 1))
                    stop.wait(think_s)
                if path == "next":
                    if next_path is None:
                        continue
                    path = next_path
                sent = time.perf_counter()
                response = client.get(path)
                took = (time.perf_counter() - sent) * 1000
                if label == "generations, first page":
                    found = NEXT_PAGE.search(response.text)
                    next_path = "/console/generations" + found.group(1).replace("&amp;", "&") if found else None
                with lock:
                    pages.append((label, took, response.status_code))
                stop.wait(think_s)


def console_users(base_url: str, users: list[dict], start: str, end: str, think_s: float, duration_s: float,
                  ready, begin, stop, results) -> None:
    """Every user in a thread of this process: signs in and warms, says `ready`, loads pages
    from `begin` until `stop`, then puts its page and export timings on `results`."""
    pages: list = []
    exports: list = []
    lock = threading.Lock()
    signed_in = threading.Barrier(len(users) + 1)
    local_begin = threading.Event()
    threads = [threading.Thread(target=one_user, daemon=True, args=(
        base_url, user, start, end, think_s, duration_s * (i + 1) / (len(users) + 1), signed_in, local_begin, stop,
        pages, exports, lock)) for i, user in enumerate(users)]
    for thread in threads:
        thread.start()
    signed_in.wait(120)
    ready.set()
    begin.wait()
    local_begin.set()
    for thread in threads:
        thread.join()
    results.put({"pages": pages, "exports": exports})


# -- the platform ---------------------------------------------------------------------------

def build(args, home: Path):
    from migrations.runner import upgrade
    from models.settings import Settings
    from pipelines.admin import commands as admin
    from pipelines.signing import signer_from_key
    from pipelines.bootstrap import Bootstrap
    from pipelines.projections import all_projections
    from pipelines.projections.runner import ProjectionRunner
    from tests.conftest import drop_postgres_databases, make_log_opener, new_postgres_database
    from tests.harness import Platform
    from tests.slow_engine import SlowEngine
    from workers.engine_runner import EngineRunner
    from workers.tiny_model import make_tiny_model

    url, name = new_postgres_database("bench_console_ttft_")
    upgrade(url)
    settings = Settings(home=home, grace_s=5.0, default_deadline_ms=60_000, decision_timeout_s=20.0,
                        database_url=url, bootstrap_token="bench-" + uuid.uuid4().hex)
    engine = SlowEngine(args.token_ms / 1000, "console-ttft-engine")
    model = make_tiny_model(home / "tiny", seed=0)  # its tokenizer counts the prompts; the engine is a stand-in
    engine.config = SimpleNamespace(model=model, max_model_len=512)
    runner = EngineRunner(engine, name="slow-engine").start()
    platform = Platform(make_log_opener("embedded", home), runner, settings, max_in_flight=args.slots)
    db = Bootstrap(settings).projection_db()
    projector = ProjectionRunner(platform._log(), db, all_projections(signer_from_key(settings.audit_signing_key)))
    stop = threading.Event()
    thread = threading.Thread(target=projector.run, args=(stop,), kwargs={"idle_s": 0.5}, name="projector",
                              daemon=True)
    thread.start()
    tenants = []
    for _ in range(3):
        tenant_id, tenant_admin = platform.tenant(scopes=("tenant_admin",), application="admin")
        keys = [admin.issue_key(platform.view, tenant_id=tenant_id, actor="bench", application_id=app,
                                scopes=("generate", "usage"))[0] for app in ("chat", "search")]
        tenants.append(SimpleNamespace(tenant_id=tenant_id, admin=tenant_admin, keys=keys))
    _, operator = platform.tenant(scopes=("operator",))

    def close() -> None:
        stop.set()
        thread.join(30)
        platform.close()
        runner.close()
        db.dispose()
        drop_postgres_databases([name])
    return SimpleNamespace(platform=platform, db=db, tenants=tenants, operator=operator, close=close)


def seed(made, count: int) -> None:
    """`count` generations over the three tenants and their two keys, then waits until the
    projector has every one in the ledger."""
    from tests.harness import MODEL_ALIAS
    from tests.helpers import wait_until

    def one(i: int) -> None:
        tenant = made.tenants[i % 3]
        with made.platform.client(tenant.keys[(i // 3) % 2]) as client:
            answer = client.post("/v1/generations", json={"model_alias": MODEL_ALIAS, "input": f"seed number {i}",
                                                          "max_output_tokens": 4, "stream": False})
            assert answer.status_code == 200, answer.text
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))

    def projected() -> bool:
        with made.db.connect() as conn:
            return conn.execute(sa.text("SELECT COUNT(*) FROM usage_ledger")).scalar() >= count
    wait_until(projected, 120, every_s=0.5, what="every seeded generation to be settled and projected")


def send(made, secret: str, i: int, output_tokens: int) -> float | None:
    """One streamed generation to its end; its TTFT in ms, None on an error."""
    from tests.harness import MODEL_ALIAS

    body = {"model_alias": MODEL_ALIAS, "input": f"serving request {i}", "max_output_tokens": output_tokens,
            "stream": True}
    began = time.perf_counter()
    ttft = None
    with made.platform.client(secret) as client, client.stream("POST", "/v1/generations", json=body) as response:
        if response.status_code != 200:
            return None
        for line in response.iter_lines():  # to its end, so the request is over when this returns
            if ttft is None and line.startswith("data: {") and json.loads(line[6:]).get("type") == "tokens":
                ttft = (time.perf_counter() - began) * 1000
    return ttft


def serving(made, args, duration_s: float, offset: int) -> dict:
    def one(i: int) -> float | None:
        try:
            return send(made, made.tenants[i % 3].keys[0], i, args.output_tokens)
        except httpx.HTTPError:
            return None
    total = int(args.rate * duration_s)
    ttfts, errors = open_loop(args.rate, total, one, first=offset)
    made.platform.check()
    return {"requests": total, "errors": errors, "ttfts": ttfts, "p50": percentile(ttfts, 0.50),
            "p95": percentile(ttfts, 0.95), "p99": percentile(ttfts, 0.99)}


def with_console(made, args, users: list[dict], start: str, end: str, offset: int) -> dict:
    spawn = multiprocessing.get_context("spawn")  # a process of its own, as a browser is
    ready, begin, stop, results = spawn.Event(), spawn.Event(), spawn.Event(), spawn.Queue()
    child = spawn.Process(target=console_users, name="console-users", daemon=True, args=(
        made.platform.base_url, users, start, end, args.think_s, args.duration_s, ready, begin, stop, results))
    child.start()
    try:
        waited = time.monotonic()
        while not ready.wait(1.0):
            if not child.is_alive() or time.monotonic() - waited > 180:
                raise RuntimeError("the console users did not sign in")
        begin.set()
        row = serving(made, args, args.duration_s, offset)
        stop.set()
        console = results.get(timeout=180)
    finally:
        stop.set()
        child.join(60)
        if child.is_alive():
            child.kill()
    took = [ms for _, ms, _ in console["pages"]]
    row.update(pages=console["pages"], exports=console["exports"], page_p50=percentile(took, 0.5),
               page_p95=percentile(took, 0.95), served=sum(1 for *_, s in console["pages"] if s == 200),
               page_errors=sum(1 for *_, s in console["pages"] if s != 200))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Source .local/services.env first (set -a && . .local/services.env "
                                            "&& set +a): the projection database is on its PostgreSQL.")
    parser.add_argument("--rate", type=float, default=8.0, help="streamed generations a second, open loop")
    parser.add_argument("--duration-s", type=float, default=30.0, help="of each phase")
    parser.add_argument("--rounds", type=int, default=3, help="B phases, each between two A phases")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="serving load before the first phase, unmeasured")
    parser.add_argument("--console-users", type=int, default=3)
    parser.add_argument("--think-s", type=float, default=0.5, help="between a user's pages")
    parser.add_argument("--seed", type=int, default=300, help="generations made and projected before measuring")
    parser.add_argument("--slots", type=int, default=8, help="the worker's slots")
    parser.add_argument("--token-ms", type=float, default=20.0, help="the stand-in engine's time per token")
    parser.add_argument("--output-tokens", type=int, default=8)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if not os.environ.get("LEDGERLM_TEST_POSTGRES"):
        print("LEDGERLM_TEST_POSTGRES is not set: set -a && . .local/services.env && set +a", file=sys.stderr)
        return 2

    home = Path(tempfile.mkdtemp(prefix="bench-console-ttft-"))
    made = build(args, home)
    try:
        started = time.perf_counter()
        seed(made, args.seed)
        print(f"seeded {args.seed} generations in {time.perf_counter() - started:.1f} s", flush=True)
        today = datetime.now(timezone.utc).date()
        start, end = (today - timedelta(days=364)).isoformat(), today.isoformat()
        users = [{"operator": i == 0, "secret": made.operator if i == 0 else made.tenants[(i - 1) % 3].admin,
                  "tenant_id": made.tenants[i % 3].tenant_id} for i in range(args.console_users)]
        offset = 0
        serving(made, args, args.warmup_s, offset)
        offset += 100_000
        phases = []
        for r in range(args.rounds + 1):
            for kind in ("A", "B") if r < args.rounds else ("A",):
                row = serving(made, args, args.duration_s, offset) if kind == "A" else with_console(
                    made, args, users, start, end, offset)
                offset += 100_000
                row.update(kind=kind, round=r + 1)
                phases.append(row)
                extra = (f"; console pages p50 {row['page_p50']:.0f} / p95 {row['page_p95']:.0f} ms, "
                         f"{row['served']} served, {row['page_errors']} refused; exports "
                         f"{[round(ms) for ms, *_ in row['exports']]} ms" if kind == "B" else "")
                print(f"{kind}{r + 1}: TTFT p50 {row['p50']:.1f} / p95 {row['p95']:.1f} / p99 {row['p99']:.1f} ms, "
                      f"{row['errors']} errors of {row['requests']}{extra}", flush=True)
    finally:
        made.close()

    a_rows = [p for p in phases if p["kind"] == "A"]
    b_rows = [p for p in phases if p["kind"] == "B"]
    mean_a = statistics.mean(p["p95"] for p in a_rows)
    table = ["| phase | TTFT p50 / p95 / p99 | errors | console pages p50 / p95 | pages served (refused) | CSV export "
             "| TTFT p95 ÷ mean of the A either side |", "|---|---|---|---|---|---|---|"]
    for i, p in enumerate(phases):
        ttft = f"{p['p50']:.0f} / {p['p95']:.0f} / {p['p99']:.0f} ms"
        if p["kind"] == "A":
            table.append(f"| A{p['round']} (serving alone) | {ttft} | {p['errors']} of {p['requests']} | - | - | - | - |")
            continue
        around = statistics.mean([phases[i - 1]["p95"], phases[i + 1]["p95"]])
        exports = ", ".join(f"{rows} rows {ms:.0f} ms" + ("" if status == 200 else f" ({status})")
                            for ms, status, rows in p["exports"]) or "none"
        table.append(f"| B{p['round']} (+ {args.console_users} console users) | {ttft} | {p['errors']} of "
                     f"{p['requests']} | {p['page_p50']:.0f} / {p['page_p95']:.0f} ms | {p['served']} "
                     f"({p['page_errors']}) | {exports} | {p['p95'] / around:.3f} |")
    pooled_a = percentile([t for p in a_rows for t in p["ttfts"]], 0.95)
    pooled_b = percentile([t for p in b_rows for t in p["ttfts"]], 0.95)
    mean_b = statistics.mean(p["p95"] for p in b_rows)
    ratio = mean_b / mean_a
    table.append(f"\nTTFT p95 with the console in use ÷ without: {ratio:.3f} (mean of the B phases' p95, "
                 f"{mean_b:.1f} ms, over the A phases', {mean_a:.1f} ms); pooled samples {pooled_b:.1f} ÷ "
                 f"{pooled_a:.1f} ms = {pooled_b / pooled_a:.3f}. Goal ≤ 1.05: "
                 f"{'met' if ratio <= 1.05 else 'not met'}.")
    by_page: dict[str, list[float]] = {}
    for p in b_rows:
        for label, ms, status in p["pages"]:
            if status == 200:
                by_page.setdefault(label, []).append(ms)
    table += ["", "| console page (every B phase) | served | p50 | p95 |", "|---|---:|---:|---:|"]
    table += [f"| {label} | {len(ms)} | {percentile(ms, 0.5):.0f} ms | {percentile(ms, 0.95):.0f} ms |"
              for label, ms in sorted(by_page.items())]
    print("\n".join(table))
    if not args.no_record:
        setup = (f"One process: embedded log, admission, one worker of {args.slots} slots on a stand-in engine "
                 f"({args.token_ms:g} ms a token, {args.output_tokens} tokens), the API with its console, the "
                 f"projector into PostgreSQL; {args.seed} generations seeded over 3 tenants and projected. Serving: "
                 f"streamed generations at {args.rate:g}/s open loop, {args.duration_s:g} s a phase, after "
                 f"{args.warmup_s:g} s unmeasured; A: serving alone; B: plus {args.console_users} console users in "
                 f"another process (one operator, the others tenant admins), a page every {args.think_s:g} s of "
                 f"think time each (usage over a year per tenant or key, generations and its next page, limits, "
                 f"keys, audit, fleet for the operator) and one CSV export of the year each a phase; phases "
                 f"A B ... A, {args.rounds} rounds")
        command = ("set -a && . .local/services.env && set +a && " + " ".join(
            shlex.quote(a) for a in [".venv/bin/python", "tests/perf/bench_console_ttft.py", *sys.argv[1:]]))
        record_run(SECTION, command, setup, "\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
