"""`ledgerlm fleet status`, run as a user runs it, shows a worker's KV cache in use while it
runs generations and back at zero once they end (both logs). The worker is a real pool
worker on a stand-in engine with a KV cache of known size: each generation holds its
one-token prompt in one block of 16 tokens until it is aborted."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from models import topics
from tests.conftest import make_log_opener
from tests.fake_engine import FakeEngine, queue_work, run_until
from tests.helpers import wait_until
from workers.engine_runner import EngineRunner
from workers.interactive import InteractiveWorker

ROOT = Path(__file__).resolve().parents[2]
KV_TOKENS, BLOCK = 4096, 16
RUNNING = 3


def fleet_status(settings, *args: str) -> str:
    env = {**os.environ, "LEDGERLM_HOME": str(settings.home), "LEDGERLM_EVENT_LOG_URL": settings.event_log_url,
           "LEDGERLM_EVENT_LOG_NAMESPACE": settings.event_log_namespace}
    result = subprocess.run([sys.executable, "-m", "api.cli", "fleet", "status", *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def worker_row(settings, worker_id: str) -> dict | None:
    report = json.loads(fleet_status(settings, "--json"))
    return next((w for w in report["workers"] if w["worker_id"] == worker_id), None)


@pytest.mark.parametrize("kind", ["embedded", "kafka"])
def test_fleet_status_shows_kv_in_use_under_load_and_zero_after(kind, tmp_path):
    opener = make_log_opener(kind, tmp_path)
    revision = f"fake@{uuid.uuid4().hex[:8]}"
    engine = FakeEngine(hold=True, kv_tokens=KV_TOKENS, block_size=BLOCK)
    runner = EngineRunner(engine, name="kv-engine").start()
    log, cancel_log = opener(), opener()
    worker = InteractiveWorker(log, runner, engine, max_in_flight=RUNNING, take_ahead=0,
                               worker_id=f"kv-worker-{uuid.uuid4().hex[:6]}", cancel_log=cancel_log,
                               revision=revision, engine_config_hash="fake", heartbeat_s=0.2)
    try:
        request_ids = [f"req_{uuid.uuid4().hex[:12]}" for _ in range(RUNNING)]
        for request_id in request_ids:
            queue_work(log, "t-kv", request_id, topic=topics.work_topic(None, "normal", revision))
        run_until(worker, lambda: len(engine.started) == RUNNING, "every generation running on the engine")
        run_until(worker, lambda: engine.kv_figures().used_tokens == RUNNING * BLOCK, "the engine to hold them")

        busy = wait_until(lambda: (w := worker_row(opener.settings, worker.worker_id))
                          and w["load"]["kv_tokens_used"] == RUNNING * BLOCK and w, 60,
                          what="fleet status to show the KV cache the generations hold")
        assert busy["capacity"]["kv_cache_tokens"] == KV_TOKENS
        assert busy["load"]["kv_cache_usage"] == RUNNING * BLOCK / KV_TOKENS
        text = fleet_status(opener.settings, "--revision", revision)
        head = next(line for line in text.splitlines() if line.startswith("WORKER"))
        row = next(line for line in text.splitlines() if line.startswith(worker.worker_id))
        end = head.index("KV USED") + len("KV USED")
        assert row[:end].split()[-2:] == [str(KV_TOKENS), str(RUNNING * BLOCK)]  # KV TOKENS, KV USED

        for request_id in request_ids:
            runner.submit(engine.abort(request_id), timeout=10)
        run_until(worker, lambda: not worker.in_flight, "the aborted generations to end")
        idle = wait_until(lambda: (w := worker_row(opener.settings, worker.worker_id))
                          and w["load"]["kv_tokens_used"] == 0 and w, 60,
                          what="fleet status to show the KV cache free again")
        assert (idle["load"]["kv_cache_usage"], idle["load"]["running"]) == (0.0, 0)
        assert idle["capacity"]["kv_cache_tokens"] == KV_TOKENS
    finally:
        worker.close(drain_timeout_s=10)
        runner.close()
        log.close()
        cancel_log.close()
