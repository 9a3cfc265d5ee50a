"""Where a test run's time went, read from its junit XML (`pytest --junitxml`): the slowest
tests and each lane's total. `make test` prints it after the suite, pass or fail.

    python -m tests.durations_report .local/junit/test.xml [more.xml ...] [--top 15]

A test's time is its setup, call and teardown together, so a session fixture's start is
counted in the first test that asked for it. Its lane is the `lane` property that
tests/conftest.py records for each test.
"""
from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

NO_LANE = "(no lane)"


@dataclass(frozen=True)
class Timed:
    test: str
    lane: str
    seconds: float


def read(path: Path) -> list[Timed]:
    """Every test case of one junit XML file."""
    found = []
    for case in ET.parse(path).getroot().iter("testcase"):
        lane = next((p.get("value") for p in case.iter("property") if p.get("name") == "lane"), NO_LANE)
        found.append(Timed(f"{case.get('classname', '')}::{case.get('name', '')}", lane,
                           float(case.get("time") or 0.0)))
    return found


def lane_totals(timed: list[Timed]) -> dict[str, tuple[int, float]]:
    """Lane -> (tests, seconds), slowest lane first."""
    totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for t in timed:
        totals[t.lane][0] += 1
        totals[t.lane][1] += t.seconds
    return {lane: (n, s) for lane, (n, s) in sorted(totals.items(), key=lambda kv: -kv[1][1])}


def report(timed: list[Timed], top: int = 15) -> str:
    lines = [f"{min(top, len(timed))} slowest tests (setup + call + teardown):"]
    for t in sorted(timed, key=lambda t: -t.seconds)[:top]:
        lines.append(f"  {t.seconds:8.1f}s  {t.lane:<21} {t.test}")
    lines.append("time per lane:")
    for lane, (count, seconds) in lane_totals(timed).items():
        lines.append(f"  {lane:<21} {seconds:8.1f}s  {count:5d} tests")
    lines.append(f"  {'all':<21} {sum(t.seconds for t in timed):8.1f}s  {len(timed):5d} tests")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    timed = []
    for path in args.xml:
        try:
            timed += read(path)
        except (OSError, ET.ParseError) as exc:  # pytest died before writing it: say so, no traceback
            print(f"durations: cannot read {path}: {exc}", file=sys.stderr)
            return 1
    print(report(timed, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
