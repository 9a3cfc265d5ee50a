"""Appends a dated entry to one section of tests/perf/RESULTS.md, keeping the others."""
from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def append_entry(section: str, entry: str) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmarks\n"
    # The section's own heading line: "## Semantic cache" is not "### Semantic cache: ...".
    found = re.search(rf"^{re.escape(section)}$", text, flags=re.MULTILINE)
    if found is None:
        text = text.rstrip("\n") + f"\n\n{section}\n"
        found = re.search(rf"^{re.escape(section)}$", text, flags=re.MULTILINE)
    head, tail = text[:found.start()], text[found.end():]
    rest = tail.split("\n## ", 1)
    body = rest[0].rstrip("\n") + "\n" + entry
    RESULTS.write_text(head + section + body + ("\n## " + rest[1] if len(rest) > 1 else ""))


def record_run(section: str, command: str, setup: str, table: str, *, heading: str = "") -> None:
    """A dated entry: the command, what was run (`setup`) with the machine's CPUs and load,
    and the table."""
    entry = (f"\n### {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC{heading}\n\n`{command}`\n\n{setup}; "
             f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end (a shared machine).\n\n"
             f"{table}\n")
    append_entry(section, entry)
