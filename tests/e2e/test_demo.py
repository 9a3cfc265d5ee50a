"""`ledgerlm demo` as a newcomer runs it (`make demo`), on a fresh platform home: it exits 0,
the real model's streamed answer is real English that a random model does not write, two
revisions were served side by side by workers of their own, and their engines computed
on different CPUs. Real vLLM (two engines), the embedded log."""
from __future__ import annotations

import os
import re
import sys

import psutil
import pytest

from models.settings import parse_cpu_list

from tests.harness import free_port
from tests.helpers import ROOT, Launched, wait_until


PREPARED = ROOT / ".local" / "ledgerlm" / "models" / "smollm2-135m-instruct"
COMMON_WORDS = {"the", "of", "is", "a", "and", "in", "it", "capital", "france", "city", "tower"}
DEMO_S = 480  # 1.5-4 minutes here; the bound leaves room for a badly loaded host
pytestmark = pytest.mark.timeout(DEMO_S + 120)


def _section(output: str, header: str) -> str:
    """The demo's output from the line starting `header` to the next `---` header."""
    match = re.search(rf"^{re.escape(header)}.*?\n(.*?)(?=^---)", output, re.S | re.M)
    assert match, f"no section {header!r} in the demo's output:\n{output[-3000:]}"
    return match.group(1)


def test_the_demo_streams_real_text_from_two_revisions_served_side_by_side(tmp_path, own_vllm):
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    if PREPARED.is_dir():  # prepared once by the install script; the demo would prepare it again (~30 s)
        (home / "models" / PREPARED.name).symlink_to(PREPARED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERLM_") or k.startswith("LEDGERLM_TEST_")}
    env.update(LEDGERLM_HOME=str(home), LEDGERLM_API_PORT=str(free_port()), PYTHONUNBUFFERED="1")
    with Launched([sys.executable, "-m", "api.cli", "demo"], env=env, log=tmp_path / "demo.log",
                  stop_s=90) as demo:
        wait_until(lambda: not demo.running(), DEMO_S, what="the demo to finish", every_s=0.5)
        output = demo.output()
        assert demo.proc.returncode == 0, demo.shown()

    answer = _section(output, "--- smollm2 ")
    words = re.findall(r"[a-z]+", answer.lower())
    assert "paris" in words, f"the real model's answer names no Paris: {answer!r}"
    assert len(COMMON_WORDS & set(words)) >= 4, f"not English: {answer!r}"
    noise = _section(output, "--- tiny ")
    assert "paris" not in noise.lower()

    ran = dict(re.findall(r"^'(\w+)' ran on worker (\S+), revision", output, re.M))
    revisions = dict(re.findall(r"^'(\w+)' ran on worker \S+, revision (\S+)", output, re.M))
    assert set(ran) == {"smollm2", "tiny"}, output[-3000:]
    assert ran["smollm2"] != ran["tiny"], "one worker ran both revisions"
    assert revisions["smollm2"].startswith("smollm2-135m-instruct@") and revisions["tiny"].startswith("tiny@")
    for alias in ("smollm2", "tiny"):  # the revision the events name is the one the alias pins
        assert re.search(rf"^fleet: '{alias}' -> {re.escape(revisions[alias])} \(1 worker", output, re.M), output

    cpus = re.search(r"^engines compute on CPUs: 'smollm2' (\S+), 'tiny' (\S+)", output, re.M)
    assert cpus, output[-3000:]
    if len(os.sched_getaffinity(0)) >= 2:
        assert cpus.group(1) != "any" and cpus.group(2) != "any"
        assert not parse_cpu_list(cpus.group(1)) & parse_cpu_list(cpus.group(2)), cpus.group(0)
    assert not _processes_of(home), "the demo left processes running"


def _processes_of(home) -> list[str]:
    """Processes still running with `home` as their platform home."""
    left = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("LEDGERLM_HOME") == str(home):
                left.append(" ".join(process.cmdline()))
        except psutil.Error:
            continue
    return left
