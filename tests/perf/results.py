"""Appends a dated entry to one section of tests/perf/RESULTS.md, keeping the others."""
from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def append_entry(section: str, entry: str) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmarks\n"
    if section not in text:
        text = text.rstrip("\n") + f"\n\n{section}\n"
    head, _, tail = text.partition(section)
    rest = tail.split("\n## ", 1)
    body = rest[0].rstrip("\n") + "\n" + entry
    RESULTS.write_text(head + section + body + ("\n## " + rest[1] if len(rest) > 1 else ""))
