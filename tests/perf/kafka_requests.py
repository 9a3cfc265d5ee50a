"""How many requests each process sends the Kafka broker per generation, and the CPU each
process (the broker too) spends per generation, on the platform as deployed.

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/kafka_requests.py --paths kafka kafka+admit [--requests 200]

For each path: the deployment of `tests/perf/deployed.py` on the Kafka of
LEDGERLM_TEST_KAFKA (`+admit`: admission in the worker), a warm-up, then `--requests`
sequential streamed requests of 8 tokens (tiny model). Meanwhile it counts the data
segments each platform process sent on its connections to the broker (`ss -ti`, Linux):
a Kafka request is one small write, so segments are requests, give or take a few large
ones. CPU is user + system time of each process (a worker's engine processes are left out:
their compute threads spin while they wait). Prints a table; records nothing.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx  # noqa: E402
import psutil  # noqa: E402

from tests.perf.bench_noisy_neighbour import bench_topics_cleared  # noqa: E402
from tests.perf.deployed import deployed, role_of  # noqa: E402
from tests.perf.ttft_segments import first_tokens, warm_up  # noqa: E402

def broker_port() -> int:
    return urlsplit(os.environ["LEDGERLM_TEST_KAFKA"]).port or 9092


def segments_to(port: int) -> dict[int, int]:
    """{pid: data segments sent so far} over every open connection to the broker's port."""
    out = subprocess.run(["ss", "-tinpH", f"dst 127.0.0.1:{port}"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    # ss prints each connection on two lines: the addresses and process, then its counters.
    lines = out.splitlines()
    counts: dict[int, int] = {}
    for head, info in zip(lines[::2], lines[1::2]):
        pid = re.search(r"pid=(\d+)", head)
        segs = re.search(r"data_segs_out:(\d+)", info)
        if pid:
            counts[int(pid.group(1))] = counts.get(int(pid.group(1)), 0) + (int(segs.group(1)) if segs else 0)
    return counts


def processes(port: int) -> dict[str, psutil.Process]:
    """The platform's processes below this one, by role, and the broker (what listens on `port`)."""
    found: dict[str, psutil.Process] = {}
    for child in psutil.Process().children(recursive=True):
        try:
            role = role_of(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if role:
            found[role] = child
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            found["broker"] = psutil.Process(conn.pid)
    return found


def cpu_s(process: psutil.Process) -> float:
    """User + system seconds of the process (a worker's engine processes not counted: their
    compute threads spin while they wait)."""
    return sum(process.cpu_times()[:2])


def measure(path: str, model: Path, home: Path, requests: int) -> dict[str, tuple[float, float]]:
    """{role: (requests to the broker per generation or None, CPU ms per generation)}."""
    port = broker_port()
    with deployed("kafka", model, home / path, max_seqs=8, take_ahead=8, stream_linger_ms=40,
                  worker_admits=path.endswith("+admit")) as platform:
        _, secret = platform.tenant()
        with httpx.Client(base_url=platform.base_url, timeout=60, headers={"Authorization": f"Bearer {secret}"}) as c:
            warm_up(c)
            for i in range(10):
                first_tokens(c, i)
            procs = processes(port)
            segs0, cpu0 = segments_to(port), {r: cpu_s(p) for r, p in procs.items()}
            for i in range(requests):
                first_tokens(c, i)
                time.sleep(0.05)
            segs1, cpu1 = segments_to(port), {r: cpu_s(p) for r, p in procs.items()}
    out = {}
    for role in cpu1:
        process = procs.get(role)
        sent = segs1.get(process.pid, 0) - segs0.get(process.pid, 0) if process and role != "broker" else None
        out[role] = (None if sent is None else sent / requests, (cpu1[role] - cpu0[role]) * 1000 / requests)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--paths", nargs="+", choices=["kafka", "kafka+admit"], default=["kafka", "kafka+admit"])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    from workers.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp, bench_topics_cleared("kafka"):
        model = make_tiny_model(Path(tmp) / "tiny", seed=0, shape="tiny")
        columns = {path: measure(path, model, Path(tmp), args.requests) for path in args.paths}
    print(f"{args.requests} sequential generations of 8 tokens per path")
    print("| path | process | requests to the broker per generation | CPU ms per generation |")
    print("|---|---|---:|---:|")
    for path, rows in columns.items():
        for role in ("api", "admission", "worker", "broker"):
            if role in rows:
                sent, cpu = rows[role]
                shown = "-" if sent is None else f"{sent:.1f}"
                print(f"| {path} | {role} | {shown} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
