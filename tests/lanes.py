"""The suite's lanes and service markers, derived from what each test uses.

A test's service markers come from its fixtures (their whole closure, so a test on the
`platform` fixture reaches `vllm` through `engine_runner`) and from its parameters: a
parameter named after a service (`kafka`, `kafka-admit`, `postgres`) means the fixture
it selects opens that service. Its lane comes from its folder, then its fixtures, then
its module's name; the first rule that matches wins (docs/testing.md).

`tests/conftest.py` applies this at collection, and the Makefile asks
`python -m tests.lanes services LANE` which services a lane's target starts, so each lane's
services are declared here once.
"""
from __future__ import annotations

import sys
from pathlib import PurePosixPath
from typing import Iterable, Mapping

# The services `infra/services.sh` starts; a lane starts only those its tests are marked with.
SERVICES = ("kafka", "postgres", "redis", "s3", "prometheus")
# What else a test may need, marked so it can be picked or left out (`-m "not vllm"`).
NEEDS = ("vllm", "browser")

# What a fixture opens. Fixtures that open a service only for some parameters (the log
# adapters, `ledger_dbs`) are found by their parameter instead.
FIXTURE_MARKS: dict[str, frozenset[str]] = {name: frozenset(marks) for name, marks in {
    "kafka_url": {"kafka"},
    "kafka_test_servers": {"kafka"},
    "kafka_bootstrap": {"kafka"},
    "postgres_url": {"postgres"},
    "console_platform": {"postgres"},
    "redis_url": {"redis"},
    "s3_endpoint": {"s3"},
    "prometheus_url": {"prometheus"},
    "batch_platform": {"redis", "s3", "vllm"},
    "engine_runner": {"vllm"},
    "vllm_engine": {"vllm"},
    "small_model_dir": {"vllm"},
    "own_vllm": {"vllm"},
    "driver": {"browser"},
}.items()}

# Lane: the services its `make test-LANE` starts. The faults lane starts every one: its
# dedicated servers run the binaries `infra/services.sh up` installs.
LANES: dict[str, tuple[str, ...]] = {
    "unit": (),
    "contract": ("kafka",),
    "ledger": ("kafka", "postgres"),
    "platform": ("kafka", "postgres"),
    "batch": ("kafka", "redis", "s3"),
    "faults-and-processes": SERVICES,
}

FOLDER_LANES = {"unit": "unit", "contract": "contract"}
LEDGER_FIXTURES = frozenset({"ledger_dbs", "ledger_log", "embedded_ledger_log"})
LEDGER_WORDS = ("projection", "projected", "audit", "migrations", "usage_daily", "slo_report")
BATCH_FIXTURES = frozenset({"batch_platform"})
BATCH_WORDS = ("test_batch",)
FAULT_WORDS = ("outage", "crash", "sigkill", "lost", "restart", "failover", "kafka_cluster", "engine_health",
               "process", "demo", "readme", "prometheus", "_cli", "test_services")


def service_marks(fixtures: Iterable[str], params: Mapping[str, object]) -> set[str]:
    """The service and need markers of a test with these fixture names and parameters."""
    marks: set[str] = set()
    for name in fixtures:
        marks |= FIXTURE_MARKS.get(name, frozenset())
    for value in params.values():
        if isinstance(value, str):
            marks |= {s for s in SERVICES if value == s or value.startswith(s + "-")}
    return marks


def lane_of(path: str, fixtures: Iterable[str]) -> str:
    """The one lane of a test in the file at `path` (relative to the repository, as in its
    node id) using these fixtures."""
    parts = PurePosixPath(path).parts
    folder = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    stem, names = PurePosixPath(path).stem, set(fixtures)
    if folder in FOLDER_LANES:
        return FOLDER_LANES[folder]
    if names & LEDGER_FIXTURES or any(word in stem for word in LEDGER_WORDS):
        return "ledger"
    if names & BATCH_FIXTURES or stem.startswith(BATCH_WORDS):
        return "batch"
    if any(word in stem for word in FAULT_WORDS):
        return "faults-and-processes"
    return "platform"


def unstarted(lane: str, marks: Iterable[str]) -> set[str]:
    """The services among `marks` that `lane`'s target does not start."""
    return (set(marks) & set(SERVICES)) - set(LANES[lane])


def main(argv: list[str]) -> int:
    """`python -m tests.lanes services LANE` prints the services LANE starts; `lanes` lists them."""
    if argv[:1] == ["lanes"]:
        print(" ".join(LANES))
        return 0
    if len(argv) == 2 and argv[0] == "services" and argv[1] in LANES:
        print(" ".join(LANES[argv[1]]))
        return 0
    print(f"usage: python -m tests.lanes services {{{','.join(LANES)}}} | lanes", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
