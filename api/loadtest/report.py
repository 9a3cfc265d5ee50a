"""Figures of a load test: per step and per tenant latency tails, throughput, goodput,
rejections by reason apart from failures; the knee of a sweep; JSON, CSV and the frontier
plot. The JSON's keys are a contract (`ledgerlm capacity plan` reads them).

`requests` counts every request sent in a step, `served` those answered in full; rates
(`requests_per_s`, `output_tokens_per_s`, goodput) are of served requests over the step's
duration, from its first send to its last answer."""
from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

from api.loadtest.driver import StepRun, Timed
from api.loadtest.workload import Slo

QUANTILES = {"p50": 50, "p95": 95, "p99": 99}


def percentiles(values: list[float]) -> dict[str, float | None]:
    import numpy

    if not values:
        return {name: None for name in QUANTILES}
    found = numpy.percentile(numpy.asarray(values, dtype=float), list(QUANTILES.values()))
    return {name: round(float(v), 3) for name, v in zip(QUANTILES, found)}


def figures(timed: list[Timed], duration_s: float, slo: Slo) -> dict:
    """The figures of a set of requests over `duration_s`: what the JSON shows per step and
    per tenant. Latencies are of served requests only; rejections and failures apart."""
    served = [t for t in timed if t.outcome == "ok"]
    good = [t for t in served if slo.request_ok(t.ttft_ms, t.tpot_ms)]
    rejections: dict[str, int] = {}
    failures: dict[str, int] = {}
    for t in timed:
        if t.outcome != "ok":
            bucket = rejections if t.outcome == "rejected" else failures
            bucket[t.reason or "unknown"] = bucket.get(t.reason or "unknown", 0) + 1
    span = max(duration_s, 1e-9)
    return {
        "requests": len(timed), "served": len(served),
        "requests_per_s": round(len(served) / span, 4),
        "output_tokens_per_s": round(sum(t.output_tokens for t in served) / span, 3),
        "goodput_requests_per_s": round(len(good) / span, 4),
        "goodput_output_tokens_per_s": round(sum(t.output_tokens for t in good) / span, 3),
        "ttft_ms": percentiles([t.ttft_ms for t in served if t.ttft_ms is not None]),
        "tpot_ms": percentiles([t.tpot_ms for t in served if t.tpot_ms is not None]),
        "itl_ms": percentiles([g for t in served for g in t.itl_ms]),
        "e2e_ms": percentiles([t.e2e_ms for t in served if t.e2e_ms is not None]),
        "output_tokens_mean": round(sum(t.output_tokens for t in served) / len(served), 2) if served else None,
        "prompt_tokens_mean": round(sum(t.prompt_tokens for t in served) / len(served), 2) if served else None,
        "repeats": sum(t.repeat for t in timed),
        "revisions": dict(Counter(t.revision for t in served if t.revision)),
        "rejections": rejections, "failures": sum(failures.values()), "failures_by_reason": failures,
    }


def meets(fig: dict, slo: Slo) -> bool:
    """A step meets the SLO when its p95s are within it and it served nearly everything."""
    if not fig["served"]:
        return False
    unserved = (fig["requests"] - fig["served"]) / fig["requests"]
    return ((slo.ttft_p95_ms is None or fig["ttft_ms"]["p95"] <= slo.ttft_p95_ms)
            and (slo.tpot_p95_ms is None or fig["tpot_ms"]["p95"] is None or fig["tpot_ms"]["p95"] <= slo.tpot_p95_ms)
            and unserved <= slo.max_unserved_share)


def step_result(run: StepRun, slo: Slo, *, number: int, mode: str, rate: float | None,
                concurrency: int | None) -> dict:
    """One step's figures; `number` counts the steps of a run from 1."""
    out = {"step": number, "mode": mode, "rate": rate, "concurrency": concurrency, "duration_s": round(run.duration_s, 3),
           **figures(run.timed, run.duration_s, slo)}
    out["meets_slo"] = meets(out, slo)
    out["offered_rate"] = round(run.sent / run.send_window_s, 4) if run.send_window_s else None
    out["client_send_lag_ms"] = percentiles([t.lag_ms for t in run.timed])
    out["client_cpu_ms_per_request"] = round(run.client_cpu_s * 1000 / max(1, len(run.timed)), 4)
    tenants = sorted({t.tenant for t in run.timed})
    out["per_tenant"] = {}
    for name in tenants:
        fig = figures([t for t in run.timed if t.tenant == name], run.duration_s, slo)
        out["per_tenant"][name] = {**fig, "meets_slo": meets(fig, slo)}
    return out


def find_knee(steps: list[dict], min_gain: float) -> tuple[int | None, str]:
    """The knee of a sweep: the last step that met the SLO before one that broke it or
    whose output throughput rose less than `min_gain` over the best before it.
    Returns (its step number, counting from 1, or None; why the sweep ended there)."""
    best, knee = 0.0, None
    for number, step in enumerate(steps, start=1):
        if not step["meets_slo"]:
            return knee, f"slo broken at step {number}"
        if number > 1 and step["output_tokens_per_s"] < best * (1 + min_gain):
            return knee, f"throughput stopped rising at step {number}"
        best, knee = max(best, step["output_tokens_per_s"]), number
    return knee, "sweep ended"


def knee_step(result: dict) -> dict | None:
    """The knee's step of a result. Steps are numbered from 1 (each carries its `step`);
    a result written before they carried it counted its knee from 0."""
    knee, steps = result.get("knee"), result.get("steps") or []
    if knee is None:
        return None
    index = knee - 1 if steps and "step" in steps[0] else knee
    return steps[index] if 0 <= index < len(steps) else None


def knee_fit(steps: list[dict]) -> dict | None:
    """guidellm's segmented fit of output throughput against the load offered (the rate,
    or the concurrency), a second opinion on the knee; `load` is where it puts the knee."""
    points = [(s["rate"] if s["mode"] == "rate" else s["concurrency"], s["output_tokens_per_s"])
              for s in steps if s["served"]]
    if len(points) < 5:  # guidellm's own minimum (MIN_POINTS); importing it costs ~10 s, so not for less
        return None
    from guidellm.benchmark.analysis.knee import find_throughput_knee

    try:
        found = find_throughput_knee([x for x, _ in points], [y for _, y in points])
    except ValueError:
        return None
    return {"status": found.status, "reason": found.reason, "load": found.knee}


CSV_FIELDS = ("step", "tenant", "mode", "rate", "concurrency", "duration_s", "requests", "served", "requests_per_s",
              "output_tokens_per_s", "goodput_requests_per_s", "goodput_output_tokens_per_s", "meets_slo",
              "ttft_ms_p50", "ttft_ms_p95", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p95", "tpot_ms_p99",
              "itl_ms_p50", "itl_ms_p95", "itl_ms_p99", "e2e_ms_p50", "e2e_ms_p95", "e2e_ms_p99",
              "rejections", "failures", "client_cpu_ms_per_request")


def _row(number: int, tenant: str, step: dict, fig: dict) -> dict:
    row = {"step": number, "tenant": tenant, "mode": step["mode"], "rate": step["rate"],
           "concurrency": step["concurrency"], "duration_s": step["duration_s"],
           "client_cpu_ms_per_request": step["client_cpu_ms_per_request"] if tenant == "*" else ""}
    for key in ("requests", "served", "requests_per_s", "output_tokens_per_s", "goodput_requests_per_s",
                "goodput_output_tokens_per_s", "meets_slo", "failures"):
        row[key] = fig[key]
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        for q, v in fig[metric].items():
            row[f"{metric}_{q}"] = v
    row["rejections"] = ";".join(f"{k}={v}" for k, v in sorted(fig["rejections"].items()))
    return row


def write(result: dict, out_dir: Path, stem: str = "loadtest") -> dict[str, Path]:
    """`<stem>.json`, `<stem>.csv` (a row per step, then per step and tenant) under `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "csv": out_dir / f"{stem}.csv"}
    paths["json"].write_text(json.dumps(result, indent=2) + "\n")
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for number, step in enumerate(result["steps"], start=1):
            writer.writerow(_row(number, "*", step, step))
            for tenant, fig in step["per_tenant"].items():
                writer.writerow(_row(number, tenant, step, fig))
    return paths


def plot(results: list[dict], path: Path) -> Path:
    """The frontier: output tokens/s against TTFT p95 and TPOT p95, one line per target,
    the knee marked and the SLO drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, label in ((axes[0], "ttft_ms", "TTFT p95 (ms)"), (axes[1], "tpot_ms", "TPOT p95 (ms)")):
        for result in results:
            pts = [(s["output_tokens_per_s"], s[metric]["p95"]) for s in result["steps"] if s[metric]["p95"]]
            if not pts:
                continue
            line, = ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=result["target"])
            knee = knee_step(result)
            if knee is not None and knee[metric]["p95"]:
                ax.plot(knee["output_tokens_per_s"], knee[metric]["p95"], marker="*", markersize=14,
                        color=line.get_color())
        limit = (results[0]["slo"] or {}).get(f"{metric.split('_')[0]}_p95_ms") if results else None
        if limit:
            ax.axhline(limit, linestyle="--", color="grey", linewidth=1, label="SLO")
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("latency-throughput frontier (star: knee)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
