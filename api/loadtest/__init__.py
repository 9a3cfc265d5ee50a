"""`ledgerlm loadtest`: a client of any OpenAI-compatible endpoint (the platform's, or
vLLM's own server), so nothing here imports the platform's server side.

    result = run(load(path), "http://127.0.0.1:8000", target_name="platform")
"""
from __future__ import annotations

import asyncio
import random
import sys

from api.loadtest import driver, report
from api.loadtest.workload import Mode, Workload, WorkloadError, load, parse

__all__ = ["run", "steps_of", "load", "parse", "Workload", "WorkloadError"]


def steps_of(mode: Mode) -> list[tuple[str, float | None, int | None]]:
    """The steps a mode runs: (kind, rate, concurrency) each."""
    if mode.kind == "rate":
        if not mode.rate:
            raise WorkloadError("a rate test needs mode.rate (requests/s)")
        return [("rate", float(mode.rate), None)]
    if mode.kind == "concurrency":
        if not mode.concurrency:
            raise WorkloadError("a concurrency test needs mode.concurrency")
        return [("concurrency", None, int(mode.concurrency))]
    if mode.rates:
        return [("rate", float(r), None) for r in sorted(mode.rates)]
    if mode.concurrencies:
        return [("concurrency", None, int(c)) for c in sorted(mode.concurrencies)]
    raise WorkloadError("a sweep needs mode.rates or mode.concurrencies, rising")


def _progress(show: bool):
    from tqdm import tqdm

    return tqdm(total=None, unit="req", disable=not show, file=sys.stderr, dynamic_ncols=True, leave=False)


async def _run(workload: Workload, target: str, *, timeout_s: float, show_progress: bool, on_step=None) -> list:
    rng = random.Random(workload.seed)
    requests = workload.requests(rng)
    sweep = workload.mode.kind == "sweep"
    steps: list[dict] = []
    bar = _progress(show_progress)
    try:
        for number, (kind, rate, concurrency) in enumerate(steps_of(workload.mode), start=1):
            bar.set_description(f"step {number} {kind} {rate if kind == 'rate' else concurrency}")
            if kind == "rate":
                run = await driver.run_rate(workload, target, rate, workload.mode.duration_s, rng, requests,
                                            timeout_s=timeout_s, progress=bar)
            else:
                run = await driver.run_concurrency(workload, target, concurrency, workload.mode.duration_s,
                                                   requests, timeout_s=timeout_s, progress=bar)
            steps.append(report.step_result(run, workload.slo, number=number, mode=kind, rate=rate,
                                            concurrency=concurrency))
            if on_step is not None:
                on_step(number, steps[-1])
            # A sweep stops at its knee: past it every step only queues more.
            if sweep and report.find_knee(steps, workload.mode.min_gain)[1] != "sweep ended":
                break
    finally:
        bar.close()
    return steps


def run(workload: Workload, target: str, *, target_name: str | None = None, replicas: int = 1,
        timeout_s: float = 300.0, show_progress: bool = True, on_step=None) -> dict:
    """Runs the workload's mode against `target` (a base URL) and returns the result
    (`report` module: the JSON contract). Steps count from 1: each step's `step`, the
    `knee` and `on_step(number, step)`."""
    steps = asyncio.run(_run(workload, target, timeout_s=timeout_s, show_progress=show_progress, on_step=on_step))
    knee, why = (None, "not a sweep")
    fit = None
    if workload.mode.kind == "sweep":
        knee, why = report.find_knee(steps, workload.mode.min_gain)
        fit = report.knee_fit(steps)
    return {"target": target_name or target, "url": target, "model": workload.model, "replicas": replicas,
            "api": workload.api, "stream": workload.stream, "slo": workload.slo.as_json(),
            "tenants": {t.name: t.share for t in workload.tenants}, "steps": steps, "knee": knee,
            "knee_reason": why, "knee_fit": fit}
