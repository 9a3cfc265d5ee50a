"""Sums py-spy's collapsed stacks (`py-spy record --format raw`) by function: the share of
samples a function was on the stack (inclusive) and on top (self), the top N of each.

    .venv/bin/python tests/perf/stacks.py FILE [--top 25] [--match TEXT]
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(.*) (\d+)$")


def frame_name(frame: str) -> str:
    """`func (path/to/file.py:123)` -> `func (file.py)`: lines apart, one entry a function."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.split(':')[0]).name})" if where else name


def summarise(path: Path) -> tuple[int, Counter, Counter]:
    total, inclusive, own = 0, Counter(), Counter()
    for line in path.read_text().splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        frames, n = m.group(1).split(";"), int(m.group(2))
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        if frames and frames[0].startswith("thread "):
            frames = frames[1:]
        total += n
        names = [frame_name(f) for f in frames]
        for name in set(names):
            inclusive[name] += n
        if names:
            own[names[-1]] += n
    return total, inclusive, own


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--match", default="", help="only functions whose entry holds this text")
    args = parser.parse_args()
    total, inclusive, own = summarise(args.file)
    print(f"{args.file.name}: {total} samples")
    for title, counts in (("inclusive", inclusive), ("self", own)):
        print(f"-- {title}")
        rows = [(k, v) for k, v in counts.most_common() if args.match in k][:args.top]
        for name, n in rows:
            print(f"{100 * n / max(1, total):5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
