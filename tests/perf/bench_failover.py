"""Failover: a fleet of fake-engine workers under steady load loses one to SIGKILL.

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/bench_failover.py [--log embedded|kafka] [--workers 8] [--before 20] [--after 20]

The platform runs as deployed (`tests/perf/deployed.py`): `ledgerlm serve api`,
`ledgerlm serve admission` and `--workers` processes of `python -m workers serve worker`,
all of one revision, each on an engine of known speed (`tests.slow_engine`, `--token-ms`
per token, `--max-seqs` at once). A client in this process sends `--rate` non-streamed
requests a second, open loop, half high priority and half normal, from `--tenants`
tenants, each with `--deadline-ms`. After a
primer (one request per tenant and priority, all answered), `--warmup` s (not counted) and
`--before` s, the worker process running the most
generations (as its heartbeats say) is SIGKILLed, as a crash would end it; the load runs
`--after` s more. Reported, from the client and from the log:

- until the killed worker's in-flight generations are terminal: from the kill to each
  terminal record on the outcomes topic (`worker_lost`, written by admission);
- until the lower capacity is seen: a `FleetView` in this process (admission's judge of a
  silent worker, on the same settings) and the API's `GET /v1/models/{alias}` serving count;
- until the killed worker's queued work is taken by another worker: the work topics are
  keyed by request, so the killed worker's share is the (priority, partition) pairs it took
  from before the kill; the first start of work from those by another worker, and the start
  of the last request that was already queued there at the kill;
- goodput per priority (requests answered 200 within their deadline, per second) in three
  windows by answer time: before the kill, during (the kill until all of the above
  happened) and after; errors by HTTP status and code; requests started twice (none should).

Prints a table and appends it, with the command, to the "Failover" section of
tests/perf/RESULTS.md (`--no-record` to skip). Nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.perf.bench_noisy_neighbour import bench_topics_cleared, percentile  # noqa: E402
from tests.perf.results import record_run  # noqa: E402

SECTION = "## Failover"


def kafka_url() -> None:
    """LEDGERLM_TEST_KAFKA from .local/services.env when the shell did not set it."""
    if os.environ.get("LEDGERLM_TEST_KAFKA"):
        return
    services = ROOT / ".local" / "services.env"
    for line in services.read_text().splitlines() if services.exists() else []:
        name, _, value = line.strip().removeprefix("export ").partition("=")
        if name == "LEDGERLM_TEST_KAFKA":
            os.environ[name] = value.strip().strip('"').strip("'")


def tenants(view, count: int) -> list[tuple[str, str]]:
    """`count` new tenants and a key of each, each allowed priority high (half its load)."""
    from pipelines.admin import commands as admin

    made: list[tuple[str, str]] = []
    while len(made) < count:
        tenant_id = "t" + uuid.uuid4().hex[:10]
        admin.create_tenant(view, tenant_id=tenant_id, name=tenant_id, actor="bench")
        admin.set_limits(view, tenant_id=tenant_id, actor="bench", may_send_high=True)
        secret, _ = admin.issue_key(view, tenant_id=tenant_id, actor="bench", scopes=("generate",),
                                    application_id="default")
        made.append((tenant_id, secret))
    return made


class Watch:
    """Samples, every `every_s` on a thread, the live workers a `FleetView` counts and the
    API's serving count for `alias`: lists of (wall time, workers)."""

    def __init__(self, log, base_url: str, alias: str, lost_after_s: float, every_s: float = 0.1):
        import httpx

        from pipelines.fleet import FleetView

        self.view = FleetView(log, lost_after_s=lost_after_s)
        self.http = httpx.Client(base_url=base_url, timeout=10)
        self.alias, self.every_s = alias, every_s
        self.fleet: list[tuple[float, int]] = []
        self.api: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.headers: dict = {}
        self.thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)

    def start(self, secret: str) -> "Watch":
        self.headers = {"Authorization": f"Bearer {secret}"}
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.view.refresh()
            self.fleet.append((time.time(), sum(c.workers for c in self.view.capacity().values())))
            try:
                serving = self.http.get(f"/v1/models/{self.alias}", headers=self.headers).json()["serving"]
                self.api.append((time.time(), serving["workers"]))
            except Exception:  # a slow answer is a gap in the samples, not the end of the run
                pass

    def busiest(self, among: set[str]) -> str:
        """The worker of `among` running the most generations, by its last heartbeat."""
        live = [w for w in self.view.live() if w.worker_id in among]
        return max(live, key=lambda w: (w.running, w.worker_id)).worker_id

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.view.close()
        self.http.close()


def first_below(samples: list[tuple[float, int]], since: float, workers: int) -> float | None:
    """Seconds from `since` to the first sample after it counting fewer than `workers`."""
    return next((at - since for at, n in samples if at >= since and n < workers), None)


def error_code(response) -> str | None:
    try:
        return (response.json().get("error") or {}).get("code")
    except ValueError:
        return "not JSON"


class Load:
    """Open-loop requests at `rate` per second from this process; each answer is recorded."""

    def __init__(self, base_url: str, keys: list[tuple[str, str]], args):
        import httpx

        self.keys, self.args = keys, args
        self.http = httpx.Client(base_url=base_url, timeout=args.deadline_ms / 1000 + 60,
                                 limits=httpx.Limits(max_connections=256, max_keepalive_connections=256))
        self.pool = ThreadPoolExecutor(256, thread_name_prefix="bench-client")
        self.sent: list[dict] = []
        self.examples: dict[str, str] = {}  # the first answer of each kind of failure

    def one(self, i: int, tenant_id: str, secret: str, priority: str) -> None:
        body = {"model_alias": self.args.alias, "input": f"Request {i}", "max_output_tokens": self.args.tokens,
                "ignore_eos": True, "stream": False, "priority": priority, "deadline_ms": self.args.deadline_ms}
        row = {"tenant": tenant_id, "priority": priority, "sent": time.time()}
        self.sent.append(row)
        try:
            response = self.http.post("/v1/generations", json=body, headers={"Authorization": f"Bearer {secret}"})
            outcome = "200" if response.status_code == 200 else f"{response.status_code} {error_code(response)}"
            if response.status_code != 200:
                self.examples.setdefault(outcome, response.text[:300])
        except Exception as exc:  # a timeout or a dropped connection is an outcome too
            outcome = f"client {type(exc).__name__}"
            self.examples.setdefault(outcome, repr(exc)[:300])
        row.update(answered=time.time(), outcome=outcome)

    def run(self, seconds: float, on_tick=None) -> None:
        """Sends for `seconds`; `on_tick(elapsed)` is called between sends (the kill)."""
        start, i = time.monotonic(), 0
        while (elapsed := time.monotonic() - start) < seconds:
            due = start + i / self.args.rate
            if due > time.monotonic():
                time.sleep(due - time.monotonic())
            tenant_id, secret = self.keys[(i // 2) % len(self.keys)]
            priority = "high" if i % 2 == 0 else "normal"
            self.pool.submit(self.one, i, tenant_id, secret, priority)
            i += 1
            if on_tick is not None:
                on_tick(elapsed)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.http.close()


def outcomes_of(log) -> tuple[dict, dict, Counter, dict]:
    """From the log: starts {request id: (worker, tenant, stamp s)}, terminals {request id:
    (status, stamp s)} (the first of each), how often each request started, and each
    request's (priority, stamp s of its request)."""
    from models import topics
    from models.events import decode

    starts, ends, started, requested = {}, {}, Counter(), {}
    for record in log.read_topic(topics.REQUESTS.name, page=5000):
        env = decode(record.value)
        if env.event_type == "GenerationRequested":
            requested[env.payload.request_id] = (env.payload.priority, record.timestamp_ms / 1000)
    for record in log.read_topic(topics.OUTCOMES.name, page=5000):
        env = decode(record.value)
        p, at = env.payload, record.timestamp_ms / 1000
        if env.event_type == "GenerationStarted":
            started[p.request_id] += 1
            starts.setdefault(p.request_id, (p.worker_id, env.tenant_id, at))
        elif env.event_type in ("GenerationCompleted", "GenerationFailed", "GenerationCancelled"):
            status = getattr(p, "error_code", None) or env.event_type.removeprefix("Generation").lower()
            ends.setdefault(p.request_id, (status, at))
    return starts, ends, started, requested


def work_partition(request_id: str, priority: str | None) -> tuple[str | None, int]:
    """Which work topic and partition a request waited on: the topics are keyed by request."""
    from models import topics
    from pipelines.eventlog import partition_for

    return priority, partition_for(request_id, topics.WORK_PARTITIONS)


def failover(log, victim: str, killed: float) -> dict:
    """What the log says of the kill: the victim's in-flight generations and their ends, and
    when work that waited on the victim's partitions was started by another worker: the
    first such start, and the last of the work that was already queued at the kill."""
    starts, ends, started, requested = outcomes_of(log)
    in_flight = {r: ends.get(r) for r, (w, _, at) in starts.items()
                 if w == victim and at < killed and (r not in ends or ends[r][1] >= killed)}
    to_end = sorted(end[1] - killed for end in in_flight.values() if end is not None)
    priority = {r: p for r, (p, _) in requested.items()}
    owned = {work_partition(r, priority.get(r)) for r, (w, _, at) in starts.items() if w == victim and at < killed}
    moved = [(at - killed, r) for r, (w, _, at) in starts.items()
             if w != victim and at >= killed and work_partition(r, priority.get(r)) in owned]
    backlog = [t for t, r in moved if requested.get(r, (None, killed))[1] < killed]
    return {"in_flight": len(in_flight), "never_ended": sum(1 for e in in_flight.values() if e is None),
            "ended_as": dict(Counter(e[0] for e in in_flight.values() if e is not None)),
            "to_terminal_first_s": to_end[0] if to_end else None, "to_terminal_last_s": to_end[-1] if to_end else None,
            "victim_partitions": len(owned),
            "taken_over_s": min(t for t, _ in moved) if moved else None,
            "backlog_taken": len(backlog), "backlog_last_s": max(backlog) if backlog else None,
            "workers_serving_before": len({w for w, _, at in starts.values() if at < killed}),
            "started_twice": sum(1 for n in started.values() if n > 1)}


def windows(sent: list[dict], killed: float, recovered: float, end: float, warm_end: float,
            deadline_ms: int) -> dict:
    """Per window (by answer time) and priority: goodput, answers, p95 latency, outcomes.
    Requests sent in the warm-up do not count."""
    bounds = {"before": (warm_end, killed), "during": (killed, recovered), "after": (recovered, end)}
    out = {}
    for name, (lo, hi) in bounds.items():
        for priority in ("high", "normal"):
            rows = [r for r in sent if r["priority"] == priority and "answered" in r
                    and lo <= r["answered"] < hi and r["sent"] >= warm_end]
            good = [r for r in rows if r["outcome"] == "200" and (r["answered"] - r["sent"]) * 1000 <= deadline_ms]
            out[(name, priority)] = {
                "seconds": hi - lo, "answers": len(rows), "good": len(good),
                "goodput_per_s": len(good) / (hi - lo) if hi > lo else float("nan"),
                "p95_ms": percentile([(r["answered"] - r["sent"]) * 1000 for r in rows], 0.95),
                "errors": dict(Counter(r["outcome"] for r in rows if r["outcome"] != "200")),
                "late": sum(1 for r in rows if r["outcome"] == "200") - len(good)}
    return out


def run(args) -> dict:
    from tests.helpers import Launched, wait_until
    from tests.perf.deployed import deployed

    from workers.tiny_model import make_tiny_model

    home = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    model = make_tiny_model(home / "tiny", seed=0)  # its tokenizer counts the prompts; the engine is fake
    environment = {"LEDGERLM_ENGINE_FACTORY": "tests.slow_engine:SlowEngine.from_settings", "LEDGERLM_CPUS": "all",
                   "LEDGERLM_TEST_TOKEN_PAUSE_S": str(args.token_ms / 1000),
                   "LEDGERLM_WORKER_LOST_AFTER_S": str(args.lost_after_s)}
    with deployed(args.log, model, home / "platform", max_seqs=args.max_seqs, take_ahead=0, stream_linger_ms=0,
                  environment=environment) as platform:
        revision = platform.view.refresh().aliases[args.alias].model_revision
        workers = [Launched([sys.executable, "-m", "workers", "serve", "worker"], env=platform.env,
                            log=home / f"worker-{k}.log", stop_s=30) for k in range(args.workers - 1)]
        try:
            mine = {json.loads(w.wait_for_output('"ready": true', 300))["worker"]: w for w in workers}
            keys = tenants(platform.view, args.tenants)
            watch = Watch(platform.log, platform.base_url, args.alias, args.lost_after_s).start(keys[0][1])
            load = Load(platform.base_url, keys, args)
            wait_until(lambda: watch.api and watch.api[-1][1] == args.workers, 60,
                       what=f"the API to see {args.workers} workers")
            # One request of each tenant and priority first, answered before the clock starts:
            # the API's tokenizer, admission and every worker's first take are warm.
            primer = Load(platform.base_url, keys, args)
            primer.run(len(keys) * 2 / args.rate)
            primer.close()
            kill_at = args.warmup + args.before
            killed: dict = {}

            def tick(elapsed: float) -> None:
                if not killed and elapsed >= kill_at:
                    victim = watch.busiest(set(mine))
                    os.kill(mine[victim].pid, signal.SIGKILL)
                    killed.update(victim=victim, at=time.time(), fleet_before=watch.fleet[-1][1])
                    print(f"killed {victim} at {kill_at:.0f} s", flush=True)

            began = time.time()
            load.run(kill_at + args.after, tick)
            end = time.time()
            load.close()  # every request answered
            watch.close()
            for w in workers:
                if w.pid != mine[killed["victim"]].pid:
                    w.check()
        finally:
            for w in workers:
                w.stop()
        found = failover(platform.log, killed["victim"], killed["at"])
    found.update(revision=revision, fleet_seen_s=first_below(watch.fleet, killed["at"], args.workers),
                 api_seen_s=first_below(watch.api, killed["at"], args.workers))
    marks = [found[k] for k in ("to_terminal_last_s", "fleet_seen_s", "api_seen_s", "taken_over_s") if found[k]]
    recovered = killed["at"] + max(marks, default=0.0)
    found["windows"] = windows(load.sent, killed["at"], recovered, end, began + args.warmup, args.deadline_ms)
    found["unanswered"] = sum(1 for r in load.sent if "answered" not in r)
    found["examples"] = load.examples
    if not args.keep:  # kept when the run failed: the processes' logs are there
        shutil.rmtree(home, ignore_errors=True)
    else:
        print(f"the processes' logs are under {home}", flush=True)
    return found


def fmt(value, unit: str = " s") -> str:
    return "-" if value is None else f"{value:.1f}{unit}"


def table(found: dict, args) -> str:
    ended = ", ".join(f"{n} {status}" for status, n in found["ended_as"].items()) or "none"
    if found["never_ended"]:
        ended += f", {found['never_ended']} never ended"
    lines = ["| figure | value |", "|---|---:|",
             f"| workers serving work before the kill (of {args.workers}) | {found['workers_serving_before']} |",
             f"| the killed worker's generations in flight | {found['in_flight']} ({ended}) |",
             f"| kill to the first / last of them terminal | {fmt(found['to_terminal_first_s'])} / "
             f"{fmt(found['to_terminal_last_s'])} |",
             f"| kill to a `FleetView` counting one worker less (as admission judges) | {fmt(found['fleet_seen_s'])} |",
             f"| kill to the API's `serving.workers` one less | {fmt(found['api_seen_s'])} |",
             f"| work partitions the killed worker took from before the kill | {found['victim_partitions']} |",
             f"| kill to the first start of work from those partitions by another worker | "
             f"{fmt(found['taken_over_s'])} |",
             f"| work queued there at the kill, started by others: count / the last one's start after the kill | "
             f"{found['backlog_taken']} / {fmt(found['backlog_last_s'])} |",
             f"| requests started twice | {found['started_twice']} |", "",
             "| window | seconds | priority | answers | within deadline | goodput (/s) | p95 latency | late | errors |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for (name, priority), w in found["windows"].items():
        errors = ", ".join(f"{n} × {code}" for code, n in sorted(w["errors"].items())) or "-"
        lines.append(f"| {name} | {w['seconds']:.1f} | {priority} | {w['answers']} | {w['good']} | "
                     f"{w['goodput_per_s']:.2f} | {w['p95_ms']:.0f} ms | {w['late']} | {errors} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log", choices=["embedded", "kafka"], default="embedded")
    parser.add_argument("--workers", type=int, default=8, help="worker processes (one is killed)")
    parser.add_argument("--max-seqs", type=int, default=4, help="generations each worker's engine runs at once")
    parser.add_argument("--token-ms", type=float, default=20.0, help="the fake engine's time per token")
    parser.add_argument("--tokens", type=int, default=25, help="output tokens per request")
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second, half of them high priority")
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--deadline-ms", type=int, default=5000)
    parser.add_argument("--lost-after-s", type=float, default=3.0, help="LEDGERLM_WORKER_LOST_AFTER_S")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--before", type=float, default=20.0)
    parser.add_argument("--after", type=float, default=20.0)
    parser.add_argument("--alias", default="tiny", help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help="keep the processes' logs")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if args.log == "kafka":
        kafka_url()
    with bench_topics_cleared(args.log):
        found = run(args)
    print(json.dumps({k: v for k, v in found.items() if k != "windows"}))
    text = table(found, args)
    print(text)
    if not args.no_record:
        record_run(SECTION, ".venv/bin/python tests/perf/bench_failover.py " + shlex.join(sys.argv[1:]),
                   f"{args.log} log; API, admission and {args.workers} worker processes as deployed, one revision, "
                   f"each worker a fake engine of {args.token_ms:g} ms a token and {args.max_seqs} sequences; "
                   f"{args.rate:g} requests/s (half high priority) of {args.tokens} tokens from {args.tenants} "
                   f"tenants, deadline {args.deadline_ms} ms; {args.before:g} s before the SIGKILL, {args.after:g} s "
                   f"after (after {args.warmup:g} s of warm-up); lost after {args.lost_after_s:g} s", text)


if __name__ == "__main__":
    main()
