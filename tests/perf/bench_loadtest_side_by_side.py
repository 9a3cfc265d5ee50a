"""Side by side: the same workload file (`ledgerlm loadtest`, a rate sweep to the knee)
against vLLM's own OpenAI server and against the platform on the embedded log and on
Kafka, each on the tiny model with the platform worker's engine settings, in one run.

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/bench_loadtest_side_by_side.py [--targets vllm embedded kafka]
        [--workload tests/perf/loadtest_workload.yaml] [--rates 2,4,8,16,32,48,64] [--duration 20]
        [--model-dir DIR]

`--model-dir` serves another model in the tiny one's place (SmolLM2: `--model-dir
.local/ledgerlm/models/smollm2-135m-instruct --workload tests/perf/loadtest_workload_small.yaml`).

Per target: the frontier (output tokens/s against TTFT p95 and TPOT p95 per step, in one
PNG), the knee, goodput at the SLO there, the platform ÷ vLLM ratio of output tokens/s at
the knee, and CPU time per output token of the serving processes apart from the engine
(the platform's API, admission and worker processes; vLLM's API server process) beside
the engine's own (the engine core processes under each). The client is this process, the
same for every target. Writes every result under `--out` and appends the table to the
"Load test side by side" section of RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.perf.results import record_run  # noqa: E402

SECTION = "## Load test side by side"
MAX_SEQS = 8  # as bench_overhead: the platform worker's engine settings, the same for vLLM's server
KEY_VARS = {"interactive": "LOADTEST_KEY_INTERACTIVE", "background": "LOADTEST_KEY_BACKGROUND"}


class CpuSplit:
    """CPU seconds of serving processes over a run: each root's own ("frontend") and that
    of the processes under it ("engine": vLLM's engine core)."""

    def __init__(self, pids: list[int]):
        import psutil

        self.roots = [psutil.Process(pid) for pid in pids]
        self.start = self._now()

    def _now(self) -> tuple[float, float]:
        import psutil

        front = engine = 0.0
        for root in self.roots:
            try:
                front += sum(root.cpu_times()[:2])
                engine += sum(sum(c.cpu_times()[:2]) for c in root.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        return front, engine

    def spent(self) -> tuple[float, float]:
        end = self._now()
        return end[0] - self.start[0], end[1] - self.start[1]


def serving_pids(names=("api", "admission", "worker")) -> list[int]:
    """This process's children that are the deployed platform's processes."""
    import psutil

    from tests.perf.deployed import role_of

    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if role_of(child.cmdline()) in names:
                found.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


@contextmanager
def vllm_server(model: Path, home: Path, kv_cache_gb: float, max_seqs: int = MAX_SEQS):
    """vLLM's own OpenAI server on the model, configured as the platform worker's engine
    (`workers.vllm_engine.VllmEngineConfig.engine_args`)."""
    from tests.harness import MODEL_ALIAS, free_port
    from tests.helpers import Launched
    from workers.vllm_engine import VllmEngineConfig

    args = VllmEngineConfig(model=model, max_model_len=512, max_num_seqs=max_seqs, kv_cache_gb=kv_cache_gb).engine_args()
    port = free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
            "--model", args["model"], "--served-model-name", MODEL_ALIAS, "--max-model-len", str(args["max_model_len"]),
            "--max-num-seqs", str(args["max_num_seqs"]), "--kv-cache-memory-bytes", str(args["kv_cache_memory_bytes"]),
            "--dtype", args["dtype"], "--seed", str(args["seed"]), "--enable-prefix-caching",
            "--scheduling-policy", args["scheduling_policy"], "--disable-log-stats", "--disable-uvicorn-access-log"]
    if args["enforce_eager"]:
        argv.append("--enforce-eager")
    server = Launched(argv, log=home / "vllm-server.log", env={**os.environ, "PYTHONUNBUFFERED": "1"}, stop_s=60)
    try:
        base = f"http://127.0.0.1:{port}"
        server.wait_until(lambda: _answers(base + "/health"), 600, what="vLLM's server to serve")
        yield base, [server.pid], {}
        server.check()
    finally:
        server.stop()


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def platform_server(log: str, model: Path, home: Path, args):
    """The platform as deployed (tests/perf/deployed.py) with a tenant per workload tenant."""
    from tests.perf.deployed import deployed

    with deployed(log, model, home / f"platform-{log}", max_seqs=MAX_SEQS, take_ahead=args.take_ahead,
                  stream_linger_ms=args.stream_linger_ms) as platform:
        keys = {var: platform.tenant()[1] for var in KEY_VARS.values()}
        yield platform.base_url, serving_pids(), keys


def run_target(name: str, server, workload_path: Path, args, out: Path) -> dict:
    from api.cli.loadtest import apply_options
    from api.loadtest import load, report, run
    from api.loadtest.workload import Mode

    with server as (base, pids, keys):
        os.environ.update(keys or {var: "none" for var in KEY_VARS.values()})
        workload = load(workload_path)
        apply_options(workload, args)
        if args.warmup > 0:  # a fresh server's first requests pay for cold caches: not measured
            warm = load(workload_path)
            warm.mode = Mode(kind="concurrency", concurrency=2, duration_s=args.warmup)
            run(warm, base, show_progress=False, timeout_s=args.timeout)
        cpu = CpuSplit(pids)
        result = run(workload, base, target_name=name, timeout_s=args.timeout, show_progress=not args.no_progress,
                     on_step=lambda i, s: print(f"{name} step {i}: {s['requests_per_s']:.2f} req/s "
                                                f"{s['output_tokens_per_s']:.1f} tok/s TTFT p95 {s['ttft_ms']['p95']} "
                                                f"SLO {'met' if s['meets_slo'] else 'broken'}", flush=True))
        front, engine = cpu.spent()
    tokens = sum(s["output_tokens_per_s"] * s["duration_s"] for s in result["steps"])
    result["serving_cpu"] = {"frontend_s": round(front, 3), "engine_s": round(engine, 3),
                             "output_tokens": round(tokens),
                             "frontend_cpu_ms_per_output_token": round(front * 1000 / max(1, tokens), 4),
                             "engine_cpu_ms_per_output_token": round(engine * 1000 / max(1, tokens), 4)}
    report.write(result, out, stem=name)
    return result


def at_knee(result: dict) -> dict | None:
    from api.loadtest import report

    return report.knee_step(result)


def table(results: dict[str, dict]) -> str:
    base = at_knee(results["vllm"]) if "vllm" in results else None
    lines = ["| target | steps (rates/s) | knee | why it ended | output tokens/s at the knee | goodput at the SLO "
             "(req/s, tokens/s) | TTFT p95 / TPOT p95 at the knee (ms) | ÷ vLLM at the knee "
             "| CPU ms per output token: serving (all but the engine) / engine | rejections / failures (all steps) |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for name, r in results.items():
        k = at_knee(r)
        rates = ", ".join(f"{s['rate']:g}" for s in r["steps"])
        rejected = sum(sum(s["rejections"].values()) for s in r["steps"])
        failed = sum(s["failures"] for s in r["steps"])
        cpu = r["serving_cpu"]
        if k is None:
            lines.append(f"| {name} | {rates} | - | {r['knee_reason']} | - | - | - | - | "
                         f"{cpu['frontend_cpu_ms_per_output_token']:.2f} / {cpu['engine_cpu_ms_per_output_token']:.2f} "
                         f"| {rejected} / {failed} |")
            continue
        ratio = f"{k['output_tokens_per_s'] / base['output_tokens_per_s']:.2f}x" if base else "-"
        lines.append(f"| {name} | {rates} | {r['knee']} ({k['rate']:g}/s) | {r['knee_reason']} | "
                     f"{k['output_tokens_per_s']:.0f} | {k['goodput_requests_per_s']:.2f}, "
                     f"{k['goodput_output_tokens_per_s']:.0f} | {k['ttft_ms']['p95']:.0f} / {k['tpot_ms']['p95']:.1f} | "
                     f"{ratio} | {cpu['frontend_cpu_ms_per_output_token']:.2f} / "
                     f"{cpu['engine_cpu_ms_per_output_token']:.2f} | {rejected} / {failed} |")
    return "\n".join(lines)


def main() -> int:
    from tests.perf.bench_noisy_neighbour import add_worker_options, bench_topics_cleared

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", choices=["vllm", "embedded", "kafka"],
                        default=["vllm", "embedded", "kafka"])
    parser.add_argument("--workload", type=Path, default=Path(__file__).with_name("loadtest_workload.yaml"))
    parser.add_argument("--rates", dest="sweep_rates", type=lambda t: [float(v) for v in t.split(",")],
                        help="the sweep's rates (default: the workload's)")
    parser.add_argument("--duration", type=float, help="seconds per step (default: the workload's)")
    parser.add_argument("--warmup", type=float, default=10.0,
                        help="seconds of two streams sent before the sweep, not measured (default 10)")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="a Hugging Face model directory (default: the tiny random model, generated)")
    parser.add_argument("--kv-cache-gb", type=float, default=0.25)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: a temporary one)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-record", action="store_true")
    add_worker_options(parser)
    args = parser.parse_args()
    # The options apply_options reads that this bench does not offer.
    args.rate = args.concurrency = args.sweep_concurrency = args.model = args.api = args.seed = None
    args.no_stream = False

    from api.loadtest import report
    from workers.tiny_model import make_tiny_model

    home = Path(tempfile.mkdtemp(prefix="loadtest-side-"))
    out = args.out or home / "results"
    model = args.model_dir.resolve() if args.model_dir else make_tiny_model(home / "tiny", seed=0, shape="tiny")
    results: dict[str, dict] = {}
    with bench_topics_cleared(*args.targets):
        for name in args.targets:
            server = (vllm_server(model, home, args.kv_cache_gb) if name == "vllm"
                      else platform_server(name, model, home, args))
            results[name] = run_target(name, server, args.workload, args, out)
            print(json.dumps({name: results[name]["serving_cpu"]}), flush=True)
    png = report.plot(list(results.values()), out / "frontier.png")
    text = table(results)
    print(text)
    print(f"results and the frontier plot: {out} ({png.name})")
    if not args.no_record:
        steps = args.sweep_rates or "the workload's"
        record_run(SECTION, ".venv/bin/python tests/perf/bench_loadtest_side_by_side.py " + shlex.join(sys.argv[1:]),
                   f"{'Model ' + model.name if args.model_dir else 'Tiny model'}, one vLLM engine each (max_num_seqs {MAX_SEQS}, KV cache {args.kv_cache_gb} GB, "
                   f"the platform worker's settings; worker take-ahead {args.take_ahead}, stream linger "
                   f"{args.stream_linger_ms} ms); workload {args.workload.name}, rates {steps}; client in the bench "
                   f"process", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
