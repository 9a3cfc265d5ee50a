"""KV-aware admission against slot counting on a real vLLM engine whose KV cache binds
before its slots do: goodput at the SLO, preemptions and TTFT p95 per prompt class.

    .venv/bin/python tests/perf/bench_kv_admission.py [--rates 3,6,9] [--duration-s 15] [--kv-overcommits 1.0,1.5]
    .venv/bin/python tests/perf/bench_kv_admission.py --rates 4 --duration-s 5 --no-record   # a quick check

One vLLM engine (CPU build, the tiny generated model) of `--blocks` KV blocks of 128 tokens
(one of them vLLM's own) under 16 sequences and a 512-token context serves every phase. For
each rate of `--rates`, the same traffic runs twice on fresh platforms in this process
(`tests.harness.Platform`, embedded log, one worker of 16 slots on that engine):

- slots: `kv_overcommit` 1e6, so no KV claim ever binds: admission and the worker count
  slots alone, as before KV claims;
- kv: `kv_overcommit` 1.0: the worker starts work while its claims (prompt plus max output,
  in whole blocks) fit what the engine's requests can hold; admission queues or sheds
  (`kv_capacity`) past its bound. Each further value of `--kv-overcommits` runs as well
  (`kv x1.5`): claims of that many caches start at once, the trade the setting documents.

Traffic: streamed generations open loop at the rate for `--duration-s`, one tenant, each a
prompt and an output length drawn (seed `--seed`) from lognormal distributions with a fat
tail (prompts: median `--prompt-median` tokens, sigma `--prompt-sigma`; outputs: median
`--output-median`, sigma 0.6), clipped to the context, outputs made in full (ignore_eos).
Every prompt starts with a tag of its own, so no prefix is shared. Classes by prompt tokens
(`models.prompt_class`, thresholds 64 and 256 for this 512-token engine).

Reported per rate and mode: requests sent, served and refused; goodput (served requests
whose client TTFT is within `--ttft-slo-ms` and whose time per output token after the first
is within `--tpot-slo-ms`, per second of the arrival window); the engine's preemptions;
client TTFT p95 per class. Appends to the "KV-aware admission" section of
tests/perf/RESULTS.md (`--no-record` to leave it).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import httpx  # noqa: E402

from models.prompt_class import PROMPT_CLASSES, PromptThresholds  # noqa: E402
from models.settings import Settings  # noqa: E402
from tests.conftest import make_log_opener  # noqa: E402
from tests.e2e.test_kv_overfill_vllm import BLOCK, MAX_MODEL_LEN, SLOTS, small_kv_engine  # noqa: E402
from tests.harness import MODEL_ALIAS, Platform  # noqa: E402
from tests.perf.open_loop import open_loop  # noqa: E402
from tests.perf.results import record_run  # noqa: E402
from workers.engine_runner import EngineRunner  # noqa: E402
from workers.tiny_model import make_tiny_model  # noqa: E402

SECTION = "## KV-aware admission"
CLASSES = PromptThresholds(short_max_tokens=64, long_min_tokens=256)
SLOT_COUNTING = 1e6  # so large that no claim binds
OUTPUT_SIGMA = 0.6


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else math.nan


def workload(args, count: int) -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) of `count` requests, the same for every mode."""
    rng = random.Random(args.seed)
    drawn = []
    for _ in range(count):
        output = min(256, max(4, round(rng.lognormvariate(math.log(args.output_median), OUTPUT_SIGMA))))
        prompt = min(MAX_MODEL_LEN - output - 8, max(4, round(rng.lognormvariate(math.log(args.prompt_median),
                                                                                 args.prompt_sigma))))
        drawn.append((prompt, output))
    return drawn


def prompt_of(engine, tokens: int) -> str:
    """A prompt of about `tokens` tokens of the engine's tokenizer, led by a tag of its own."""
    tag = uuid.uuid4().hex[:8]
    words = max(0, tokens - engine.count_tokens(tag))
    for _ in range(4):  # a word is a token or so; a few corrections reach the count
        text = f"{tag} " + "ledger " * words
        missing = tokens - engine.count_tokens(text)
        if missing == 0 or words + missing < 0:
            break
        words += missing
    return text


def one(platform: Platform, secret: str, prompt: str, output: int) -> dict | None:
    """One streamed generation: its class, whether it was served, TTFT and time per token."""
    body = {"model_alias": MODEL_ALIAS, "input": prompt, "max_output_tokens": output, "ignore_eos": True,
            "stream": True}
    began, ttft, final = time.perf_counter(), None, {}
    try:
        with platform.client(secret) as client, client.stream("POST", "/v1/generations", json=body) as response:
            if response.status_code != 200:
                return {"served": False, "code": json.loads(response.read())["error"]["code"]}
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    final = json.loads(line[6:])
                    if ttft is None and final.get("type") == "tokens":
                        ttft = time.perf_counter() - began
    except httpx.HTTPError:
        return None
    usage, total = final.get("usage", {}), time.perf_counter() - began
    made = usage.get("output_tokens", 0)
    if final.get("type") != "completed" or ttft is None:
        return {"served": False, "code": final.get("type")}
    return {"served": True, "class": CLASSES.classify(usage.get("input_tokens", 0)), "ttft_s": ttft,
            "tpot_s": (total - ttft) / (made - 1) if made > 1 else 0.0}


def modes(args) -> dict[str, float]:
    """Each mode's `kv_overcommit`: slot counting, then KV-aware at each of `--kv-overcommits`."""
    factors = [float(f) for f in args.kv_overcommits.split(",")]
    return {"slots": SLOT_COUNTING, **{"kv" if f == 1.0 else f"kv x{f:g}": f for f in factors}}


def run_mode(runner: EngineRunner, args, mode: str, rate: float, traffic: list[tuple[str, int]]) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"bench-kv-{mode}-"))
    settings = Settings(home=home, grace_s=5.0, default_deadline_ms=60_000, decision_timeout_s=20.0,
                        kv_overcommit=modes(args)[mode], prompt_short_max_tokens=CLASSES.short_max_tokens,
                        prompt_long_min_tokens=CLASSES.long_min_tokens)
    platform = Platform(make_log_opener("embedded", home), runner, settings, max_in_flight=SLOTS)
    try:
        _, secret = platform.tenant()
        one(platform, secret, "warm", 4)
        preempted = runner.engine.kv_figures().preemptions
        results, errors = open_loop(rate, len(traffic), lambda i: one(platform, secret, *traffic[i]))
        platform.check()
        preemptions = runner.engine.kv_figures().preemptions - preempted
    finally:
        platform.close()
    served = [r for r in results if r["served"]]
    good = [r for r in served if r["ttft_s"] * 1000 <= args.ttft_slo_ms and r["tpot_s"] * 1000 <= args.tpot_slo_ms]
    window = len(traffic) / rate
    row = {"mode": mode, "rate": rate, "sent": len(traffic), "served": len(served), "errors": errors,
           "refused": {code: sum(1 for r in results if not r["served"] and r["code"] == code)
                       for code in sorted({r["code"] for r in results if not r["served"]})},
           "good": len(good), "goodput": len(good) / window, "preemptions": preemptions,
           "tpot_p95_ms": percentile([r["tpot_s"] * 1000 for r in served], 0.95)}
    for cls in PROMPT_CLASSES:
        ttfts = [r["ttft_s"] * 1000 for r in served if r["class"] == cls]
        row[cls] = (len(ttfts), percentile(ttfts, 0.95))
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| rate /s | admission | served of sent (refused) | goodput /s | preemptions | TTFT p95 short "
             "| TTFT p95 medium | TTFT p95 long | time per token p95 |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        refused = ", ".join(f"{n} {code}" for code, n in r["refused"].items()) or "none"
        classes = " | ".join(f"{p95:,.0f} ms (n {n})" if n else "-" for n, p95 in (r[c] for c in PROMPT_CLASSES))
        lines.append(f"| {r['rate']:g} | {r['mode']} | {r['served']} of {r['sent']} ({refused}"
                     f"{', ' + str(r['errors']) + ' errors' if r['errors'] else ''}) | {r['goodput']:.2f} "
                     f"| {r['preemptions']} | {classes} | {r['tpot_p95_ms']:.1f} ms |")
    return "\n".join(lines)


def verdict(rows: list[dict]) -> str:
    """The bar, per rate: KV goodput (`kv_overcommit` 1.0) at least slot counting's, no
    preemption, long p95 no worse."""
    out = []
    for rate in sorted({r["rate"] for r in rows}):
        slots, kv = (next(r for r in rows if r["rate"] == rate and r["mode"] == m) for m in ("slots", "kv"))
        checks = {"goodput": kv["goodput"] >= slots["goodput"], "0 preemptions": kv["preemptions"] == 0}
        if kv["long"][0] and slots["long"][0]:  # a p95 of none is no figure
            checks["long p95"] = kv["long"][1] <= slots["long"][1]
        met = [name for name, ok in checks.items() if ok]
        missed = [name for name, ok in checks.items() if not ok]
        out.append(f"at {rate:g}/s: " + (f"met ({', '.join(met)})" if not missed else
                                         f"missed {', '.join(missed)}" + (f"; met {', '.join(met)}" if met else "")))
    return "Bar (KV goodput ≥ slots, 0 preemptions, long-class p95 no worse) " + "; ".join(out) + "."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="3,6,9", help="requests a second, comma separated")
    parser.add_argument("--duration-s", type=float, default=15.0, help="arrival window of each rate and mode")
    parser.add_argument("--kv-overcommits", default="1.0,1.5", help="KV-aware modes; 1.0 is the bar's")
    parser.add_argument("--blocks", type=int, default=8, help="KV blocks of 128 tokens")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prompt-median", type=float, default=64.0)
    parser.add_argument("--prompt-sigma", type=float, default=1.2)
    parser.add_argument("--output-median", type=float, default=96.0)
    parser.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    parser.add_argument("--tpot-slo-ms", type=float, default=50.0)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    if 1.0 not in modes(args).values():
        parser.error("--kv-overcommits must hold 1.0, the mode the bar is judged on")

    began = time.perf_counter()
    model = make_tiny_model(Path(tempfile.mkdtemp(prefix="bench-kv-model-")) / "tiny", seed=0)
    runner = EngineRunner(small_kv_engine(model, blocks=args.blocks), name="bench-kv-engine")
    rows = []
    try:
        runner.start(timeout=600)
        for rate in rates:
            drawn = workload(args, max(1, round(rate * args.duration_s)))
            traffic = [(prompt_of(runner.engine, p), o) for p, o in drawn]
            for mode in modes(args):
                rows.append(run_mode(runner, args, mode, rate, traffic))
    finally:
        runner.close()
    took = time.perf_counter() - began
    result = table(rows) + "\n\n" + verdict(rows)
    print(result)
    print(f"whole run {took:.0f} s")
    if not args.no_record:
        command = ".venv/bin/python tests/perf/bench_kv_admission.py " + shlex.join(sys.argv[1:])
        setup = (f"One vLLM engine (CPU, tiny model) of {args.blocks} KV blocks of {BLOCK} tokens, {SLOTS} "
                 f"sequences, {MAX_MODEL_LEN}-token context, shared by every phase; one worker of {SLOTS} slots on "
                 f"the embedded log; open loop {args.duration_s:g} s a rate and mode; prompts lognormal (median "
                 f"{args.prompt_median:g}, sigma {args.prompt_sigma:g}), outputs lognormal (median "
                 f"{args.output_median:g}, sigma {OUTPUT_SIGMA}), seed {args.seed}; SLO: TTFT ≤ "
                 f"{args.ttft_slo_ms:g} ms and time per output token ≤ {args.tpot_slo_ms:g} ms; whole run {took:.0f} s")
        record_run(SECTION, command, setup, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
