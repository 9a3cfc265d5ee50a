"""Where a request's time to first token goes, segment by segment, on the platform as
deployed (tiny model): sequential streamed requests, each split by the log's record
stamps (ms resolution) and the client's clock (same host).

    .venv/bin/python tests/perf/ttft_segments.py --paths kafka kafka+admit [--requests 40]

`+admit` runs the worker with admission in it (`serve worker --admit`). Segments:
client send to the API's prompt append, prompt to request append, request to admission's
reservation, reservation to the stream copy of the start (the take's commit), start to
the first tokens on the stream, and those tokens to the client.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx  # noqa: E402

from models import topics  # noqa: E402
from tests.harness import MODEL_ALIAS  # noqa: E402
from tests.helpers import wait_until  # noqa: E402
from tests.perf.bench_noisy_neighbour import bench_topics_cleared  # noqa: E402
from tests.perf.bench_overhead import first_stamps, percentile  # noqa: E402
from tests.perf.deployed import deployed  # noqa: E402

MARKS = ["client sends", "prompts:PromptSubmitted", "requests:GenerationRequested", "ledger:BudgetReserved",
         "stream:GenerationStarted", "stream:TokensEmitted", "client gets first tokens"]


def first_tokens(client: httpx.Client, i: int) -> tuple[str, float, float]:
    body = {"model_alias": MODEL_ALIAS, "input": f"segment {i}", "max_output_tokens": 8, "ignore_eos": True}
    sent, first, request_id = time.time() * 1000, None, None
    with client.stream("POST", "/v1/generations", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                frame = json.loads(line[6:])
                if frame["type"] == "tokens" and first is None:
                    first, request_id = time.time() * 1000, frame["request_id"]
    return request_id, sent, first


def warm_up(client: httpx.Client, timeout_s: float = 30.0) -> None:
    """Sends a short request until the platform serves one (its first may meet a worker
    still joining its group)."""
    warm = {"model_alias": MODEL_ALIAS, "input": "warm", "max_output_tokens": 2, "stream": False}
    wait_until(lambda: client.post("/v1/generations", json=warm).status_code == 200, timeout_s, every_s=0.2,
               what="the platform to serve the warm-up request")


def measure(path: str, model: Path, home: Path, requests: int) -> dict[str, float]:
    log_kind, _, admit = path.partition("+")
    with deployed(log_kind, model, home / path, max_seqs=8, take_ahead=8, stream_linger_ms=40,
                  worker_admits=bool(admit)) as platform:
        tenant_id, secret = platform.tenant()
        with httpx.Client(base_url=platform.base_url, timeout=60, headers={"Authorization": f"Bearer {secret}"}) as c:
            warm_up(c)
            marks = []
            for i in range(requests):
                marks.append(first_tokens(c, i))
                time.sleep(0.05)
        by_request = first_stamps(platform.log, tenant_id,
                                  (topics.PROMPTS, topics.REQUESTS, topics.LEDGER, topics.STREAM))
    segments: dict[str, list[float]] = {f"{a} -> {b}": [] for a, b in zip(MARKS, MARKS[1:])}
    for request_id, sent, first in marks:
        times = {"client sends": sent, **by_request.get(request_id, {}), "client gets first tokens": first}
        for a, b in zip(MARKS, MARKS[1:]):
            if a in times and b in times:
                segments[f"{a} -> {b}"].append(times[b] - times[a])
    out = {name: percentile(xs, 0.5) for name, xs in segments.items()}
    out["TTFT"] = percentile([first - sent for _, sent, first in marks], 0.5)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--paths", nargs="+", choices=["embedded", "kafka", "embedded+admit", "kafka+admit"],
                        default=["kafka", "kafka+admit"])
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    from workers.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp, bench_topics_cleared(*(p.partition("+")[0] for p in args.paths)):
        model = make_tiny_model(Path(tmp) / "tiny", seed=0, shape="tiny")
        columns = {path: measure(path, model, Path(tmp), args.requests) for path in args.paths}
    rows = list(next(iter(columns.values())))
    print("| segment (p50, ms) | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for row in rows:
        print(f"| {row} | " + " | ".join(f"{columns[p][row]:.1f}" for p in columns) + " |")


if __name__ == "__main__":
    main()
