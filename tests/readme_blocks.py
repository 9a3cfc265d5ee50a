"""The README's runnable blocks, and running them as a reader would: pasted in order into
one shell.

The blocks are every fenced `sh` (or `bash`, `shell`) and `python` block from the
`## Quickstart` heading to the first `## ` heading after the tour's heading; fences of any
other kind (`text`, `json`, ...) are shown, not run. A block whose fence is directly below
the line `<!-- readme-test: skip: REASON -->` is not run; a marker without a reason, or
one that stands above no fence, is an error, so a skip always says why.

`run_blocks` runs the blocks in one bash process under `set -eo pipefail`: shell blocks
verbatim, python blocks as `python - <<'READMEPY'` heredocs, each followed by the line
`README-BLOCK n OK`. The run leads a process session of its own, carries a marker in its
environment, and is bounded as a whole and per block. On leaving, bash stops its
background jobs as the README says (`kill $(jobs -p)`) and waits for them; a process still
carrying the marker then is reported as lingering. The session is killed after that, and a
process carrying the marker even then (it left the session) as a survivor, and killed.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
from tests.helpers import wait_until

START_HEADING = "## Quickstart"
TOUR_HEADING = "## A tour of what it does"
SHELL_LANGS = frozenset({"sh", "bash", "shell"})
PYTHON_LANGS = frozenset({"python", "py"})
SKIP_MARKER = re.compile(r"^<!--\s*readme-test:\s*skip:\s*(?P<reason>.*?)\s*-->$")
DIRECTIVE = re.compile(r"^<!--\s*readme-test\b")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
HEREDOC_END = "READMEPY"
OK_LINE = re.compile(r"README-BLOCK (\d+) OK$", re.M)
HOME_LINE = re.compile(r"^README-HOME (.*)$", re.M)
MARKER_VAR = "README_RUN_MARKER"


class ReadmeError(Exception):
    """The README cannot be run as written: a missing heading, an unclosed fence, a skip
    marker without a reason or without a block below it."""


@dataclass(frozen=True)
class Block:
    number: int  # 1-based, in reading order, skipped blocks counted
    lang: str  # "sh" or "python"
    text: str
    line: int  # the README line of its opening fence
    skip: str | None = None  # the reason it is not run

    def head(self, lines: int = 5) -> str:
        shown = self.text.splitlines()[:lines]
        return "\n".join(shown) + ("\n..." if len(self.text.splitlines()) > lines else "")


def _section(lines: list[str]) -> tuple[int, int]:
    """The line range [start, end) from the Quickstart heading to the first `## ` heading
    after the tour heading; headings inside fences do not count."""
    start = tour = None
    fence = None
    for i, line in enumerate(lines):
        match = FENCE.match(line)
        if match and (fence is None or (match["fence"][0] == fence[0] and len(match["fence"]) >= len(fence)
                                         and not match["info"].strip())):
            fence = match["fence"] if fence is None else None
            continue
        if fence is not None or not line.startswith("## "):
            continue
        if start is None and line.rstrip() == START_HEADING:
            start = i
        elif start is not None and tour is None and line.rstrip() == TOUR_HEADING:
            tour = i
        elif tour is not None:
            return start, i
    if start is None or tour is None:
        missing = START_HEADING if start is None else TOUR_HEADING
        raise ReadmeError(f"the README has no {missing!r} heading" + ("" if start is None else " after the Quickstart"))
    if fence is not None:
        raise ReadmeError("the README ends inside a fenced block")
    return start, len(lines)


def extract_blocks(readme: str) -> list[Block]:
    """The runnable blocks of the README text, skipped ones included (with their reason)."""
    lines = readme.splitlines()
    start, end = _section(lines)
    blocks: list[Block] = []
    i = start
    while i < end:
        line = lines[i]
        if DIRECTIVE.match(line.strip()):
            marker = SKIP_MARKER.match(line.strip())
            if not marker or not marker["reason"]:
                raise ReadmeError(f"README line {i + 1}: a readme-test marker needs a reason "
                                  f"(<!-- readme-test: skip: REASON -->): {line.strip()!r}")
            if i + 1 >= end or not FENCE.match(lines[i + 1]):
                raise ReadmeError(f"README line {i + 1}: the skip marker stands above no fenced block")
        match = FENCE.match(line)
        if not match:
            i += 1
            continue
        close = _closing(lines, i, end, match)
        lang = match["info"].strip().split(" ")[0].lower()
        body = "\n".join(_dedent(line, len(match["indent"])) for line in lines[i + 1:close])
        if lang in SHELL_LANGS or lang in PYTHON_LANGS:
            previous = SKIP_MARKER.match(lines[i - 1].strip()) if i > 0 else None
            blocks.append(Block(number=len(blocks) + 1, lang="python" if lang in PYTHON_LANGS else "sh",
                                text=body + "\n", line=i + 1, skip=previous["reason"] if previous else None))
        i = close + 1
    return blocks


def _closing(lines: list[str], opening: int, end: int, match: re.Match) -> int:
    for j in range(opening + 1, end):
        close = FENCE.match(lines[j])
        if close and close["fence"][0] == match["fence"][0] and len(close["fence"]) >= len(match["fence"]) \
                and not close["info"].strip():
            return j
    raise ReadmeError(f"README line {opening + 1}: the fenced block is not closed before the section ends")


def _dedent(line: str, indent: int) -> str:
    return line[min(indent, len(line) - len(line.lstrip(" "))):]


@dataclass(frozen=True)
class Rewrite:
    """One change the test makes to the README's text before running it, and why. Each must
    match exactly once, so a README change that defeats it fails the test."""
    old: str
    new: str
    why: str


def apply_rewrites(blocks: list[Block], rewrites: list[Rewrite]) -> list[Block]:
    """The blocks with each rewrite applied; a rewrite that does not match exactly once in
    the run blocks is a ReadmeError naming it."""
    for rewrite in rewrites:
        found = sum(b.text.count(rewrite.old) for b in blocks if b.skip is None)
        if found != 1:
            raise ReadmeError(f"the rewrite of {rewrite.old!r} ({rewrite.why}) matched {found} times, not once")
        blocks = [replace(b, text=b.text.replace(rewrite.old, rewrite.new)) if b.skip is None else b for b in blocks]
    return blocks


def script(blocks: list[Block]) -> str:
    """The bash script that runs the blocks in order, as one pasted session."""
    parts = ["set -eo pipefail",
             # On leaving, however it leaves: say where the platform home was, stop the
             # background jobs as the README says, and wait for them.
             "trap 'readme_status=$?; trap - EXIT; set +e; echo; echo \"README-HOME ${LEDGERLM_HOME:-}\"; "
             "readme_jobs=$(jobs -p); [ -z \"$readme_jobs\" ] || kill $readme_jobs 2>/dev/null; wait; "
             "exit $readme_status' EXIT"]
    for block in blocks:
        if block.skip is not None:
            parts.append(f"# README block {block.number} skipped: {block.skip}")
            continue
        parts.append(f"# README block {block.number} (README line {block.line})")
        if block.lang == "python":
            if re.search(rf"^{HEREDOC_END}$", block.text, re.M):
                raise ReadmeError(f"README block {block.number} holds the line {HEREDOC_END}")
            parts.append(f"python - <<'{HEREDOC_END}'\n{block.text}{HEREDOC_END}")
        else:
            parts.append(block.text.rstrip("\n"))
        parts.append(f"printf '\\nREADME-BLOCK {block.number} OK\\n'")
    return "\n".join(parts) + "\n"


@dataclass
class RunResult:
    returncode: int | None  # None: killed at a bound
    output: str
    passed: list[int]  # the numbers of the blocks that ran to their end
    failed: Block | None  # the block that failed or overran; None when all passed
    timed_out: str | None  # which bound was passed, if one was
    home: str | None  # LEDGERLM_HOME as the shell had it when it left
    lingering: list[str]  # processes of the run alive after the shell stopped its jobs and left
    survivors: list[str]  # processes of the run still alive after its session was killed


def run_blocks(blocks: list[Block], *, cwd: Path, env: dict[str, str], timeout_s: float,
               block_timeout_s: float, stop_s: float = 60.0, kill_grace_s: float = 20.0) -> RunResult:
    """Runs the blocks in one bash session in `cwd`; see the module's docstring."""
    marker = uuid.uuid4().hex
    to_run = [b for b in blocks if b.skip is None]
    with tempfile.TemporaryDirectory(prefix="readme-run-") as scratch:
        path, out = Path(scratch) / "readme.sh", Path(scratch) / "output.log"
        path.write_text(script(blocks))
        with open(out, "wb") as sink:
            proc = subprocess.Popen(["bash", str(path)], cwd=cwd, env={**env, MARKER_VAR: marker},
                                    stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            timed_out = _watch(proc, out, [b.number for b in to_run], timeout_s, block_timeout_s)
            try:  # the shell's trap stops its jobs as the README says
                proc.wait(timeout=0.0 if timed_out else stop_s)
            except subprocess.TimeoutExpired:
                pass
            lingering = [] if timed_out else _marked(marker, but=proc.pid)
            _end_session(proc, kill_grace_s)
        output = out.read_text(errors="replace")
    passed = [int(n) for n in OK_LINE.findall(output)]
    failed = None
    if timed_out or proc.returncode != 0:
        failed = next((b for b in to_run if b.number not in passed), None)
    home = HOME_LINE.findall(output)
    return RunResult(returncode=None if timed_out else proc.returncode, output=output, passed=passed,
                     failed=failed, timed_out=timed_out, home=home[-1] if home else None,
                     lingering=lingering, survivors=_marked(marker, kill=True))


def _watch(proc: subprocess.Popen, out: Path, numbers: list[int], timeout_s: float,
           block_timeout_s: float) -> str | None:
    """Waits for the shell to finish its blocks; returns which bound it passed, if any."""
    started = block_started = time.monotonic()
    done = 0
    while proc.poll() is None:
        now_done = len(OK_LINE.findall(out.read_text(errors="replace")))
        if now_done != done:
            done, block_started = now_done, time.monotonic()
        if done >= len(numbers):
            return None  # the shell is leaving: its trap stops the background jobs
        if time.monotonic() - started > timeout_s:
            return f"the whole run passed its bound of {timeout_s:g} s"
        if time.monotonic() - block_started > block_timeout_s:
            return f"block {numbers[done]} passed its bound of {block_timeout_s:g} s"
        try:  # wakes as soon as the shell exits, else looks at its progress again
            proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
    return None


def _end_session(proc: subprocess.Popen, grace_s: float) -> None:
    """Ends whatever is left of the run's session: TERM, and KILL to what outlives a grace."""
    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            wait_until(lambda: not _in_session(proc), grace, what="the run's session to empty", every_s=0.1)
        except AssertionError:
            continue  # what outlived this signal gets the next one
    proc.wait(timeout=5.0)


def _in_session(proc: subprocess.Popen) -> bool:
    """Whether any process of the run's session is alive (the shell reaped as it ends)."""
    proc.poll()
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == proc.pid and process.status() != psutil.STATUS_ZOMBIE:
                return True
        except (psutil.Error, ProcessLookupError):
            continue
    return False


def _marked(marker: str, *, but: int | None = None, kill: bool = False) -> list[str]:
    """The live processes carrying the run's marker (outside its session too), other than
    `but`; with `kill`, each is killed."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != but and process.environ().get(MARKER_VAR) == marker \
                    and process.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{process.pid}: {' '.join(process.cmdline())}")
                if kill:
                    process.kill()
        except psutil.Error:
            continue
    return found


def failure_report(result: RunResult, *, home: Path | None = None, log_lines: int = 25,
                   output_lines: int = 80) -> str:
    """What a failed run shows: the failing block, the output's tail and the tail of each
    log under the platform home's `logs/` (the shell's, else `home`)."""
    parts = []
    if result.failed is not None:
        parts.append(f"README block {result.failed.number} (README line {result.failed.line}) failed"
                     + (f": {result.timed_out}" if result.timed_out else f", exit status {result.returncode}")
                     + f"\n{result.failed.head()}")
    else:
        parts.append(f"the run failed (exit status {result.returncode}, {result.timed_out or 'no bound passed'}) "
                     f"after blocks {result.passed}")
    for what, processes in (("alive after the shell stopped its jobs", result.lingering),
                            ("alive after its session was killed", result.survivors)):
        if processes:
            parts.append(f"processes {what}: " + "; ".join(processes))
    parts.append("--- output (tail) ---\n" + "\n".join(result.output.splitlines()[-output_lines:]))
    home = Path(result.home) if result.home else home
    logs = home / "logs" if home else None
    if logs is not None and logs.is_dir():
        for log in sorted(logs.iterdir()):
            tail = log.read_text(errors="replace").splitlines()[-log_lines:]
            parts.append(f"--- {log} (tail) ---\n" + "\n".join(tail))
    return "\n".join(parts)
