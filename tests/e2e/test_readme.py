"""The README as a reader runs it: every `sh` and `python` block from the Quickstart to the
end of the tour, pasted in order into one shell (tests/readme_blocks.py), each expected to
finish without error. Real vLLM (the tiny model and SmolLM2), the embedded log, the seven
processes the Quickstart starts and those the tour adds, all stopped at the end.

The shell runs in a fresh directory that stands in for the repository root: every entry
of the root is linked into it except `.local/`, so the Quickstart's
`$PWD/.local/quickstart` is a new, empty platform home and the files the tour writes
(`requests.jsonl`, `usage.csv`, ...) land there rather than in the checkout."""
from __future__ import annotations

import os

import pytest

from tests.harness import free_port
from tests.helpers import ROOT
from tests.readme_blocks import Rewrite, apply_rewrites, extract_blocks, failure_report, run_blocks

RUN_S = 900  # the whole README; each block has its own, shorter bound
BLOCK_S = 360  # the slowest block starts vLLM engines or waits on a batch
STOP_S = 90  # for `kill $(jobs -p)` to stop every process the blocks started
pytestmark = pytest.mark.timeout(RUN_S + STOP_S + 120)


def rewrites(port: int) -> list[Rewrite]:
    """What the test changes in the README's text before running it; each must match once."""
    return [Rewrite(old="export LEDGERLM_API_URL=http://127.0.0.1:8000\n",
                    new=f"export LEDGERLM_API_PORT={port}\nexport LEDGERLM_API_URL=http://127.0.0.1:{port}\n",
                    why="port 8000 may be taken: the Quickstart's own advice, a free port and the URL to match")]


def reader_root(tmp_path):
    """A directory standing in for the repository root, with a `.local/` of its own."""
    root = tmp_path / "repo"
    root.mkdir()
    for entry in ROOT.iterdir():
        if entry.name != ".local":
            (root / entry.name).symlink_to(entry)
    (root / ".local").mkdir()
    return root


def test_the_readme_quickstart_and_tour_run_as_written(tmp_path, own_vllm):
    blocks = apply_rewrites(extract_blocks((ROOT / "README.md").read_text()), rewrites(free_port()))
    to_run = [b.number for b in blocks if b.skip is None]
    assert to_run, "the README has no block to run between the Quickstart and the end of the tour"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERLM_") or k.startswith("LEDGERLM_TEST_")}
    env["PYTHONUNBUFFERED"] = "1"
    root = reader_root(tmp_path)
    home = root / ".local" / "quickstart"

    result = run_blocks(blocks, cwd=root, env=env, timeout_s=RUN_S, block_timeout_s=BLOCK_S, stop_s=STOP_S)

    assert result.returncode == 0 and result.failed is None, failure_report(result, home=home)
    assert result.passed == to_run, failure_report(result, home=home)
    # The run started from an empty home only if the Quickstart's home is under the fresh `.local/`.
    assert result.home == str(home), f"the Quickstart's LEDGERLM_HOME moved: {result.home}"
    assert not result.lingering, f"processes the README started outlived `kill $(jobs -p)`: {result.lingering}"
    assert not result.survivors, f"processes the README started outlived their session: {result.survivors}"
