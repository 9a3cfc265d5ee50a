"""The embedded quick start runs batches: `ledgerlm serve api`, `serve batch-dispatcher`
and `serve batch-worker` as separate processes on the embedded defaults (SQLite log,
local object store, Celery on the embedded SQLite broker), driven by `ledgerlm batch`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.harness import free_port
from tests.helpers import Launched, wait_until

CLI = [sys.executable, "-m", "api.cli"]


@pytest.fixture
def embedded_platform(tmp_path, tiny_model_dir, own_vllm):
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LEDGERLM_HOME": str(tmp_path / "home"),
           "LEDGERLM_MODEL": str(tiny_model_dir), "LEDGERLM_API_PORT": str(port), "LEDGERLM_KV_CACHE_GB": "0.125",
           "LEDGERLM_ENGINE_MAX_SEQS": "8", "LEDGERLM_BATCH_CHUNK_SIZE": "3", "LEDGERLM_LOG_LEVEL": "INFO"}
    for name in [k for k in env if k.startswith("LEDGERLM_") and k.endswith(("_URL", "_NAMESPACE"))]:
        env.pop(name)  # the embedded defaults, whatever the calling shell had set
    subprocess.run([sys.executable, "-m", "workers", "model", "approve"], env=env, check=True, timeout=300,
                   capture_output=True)
    subprocess.run([*CLI, "admin", "tenant", "create", "demo"], env=env, check=True, timeout=60, capture_output=True)
    issued = subprocess.run([*CLI, "admin", "key", "issue", "--tenant", "demo", "--scopes", "batch"], env=env,
                            check=True, timeout=60, capture_output=True, text=True)
    procs = []
    try:
        for name, argv, ready in [("api", [*CLI, "serve", "api"], '"api": "ready"'),
                                  ("dispatcher", [*CLI, "serve", "batch-dispatcher"], '"batch_dispatcher": "ready"'),
                                  ("worker", [*CLI, "serve", "batch-worker"], "ready.")]:
            procs.append(Launched(argv, env=env, log=tmp_path / f"{name}.log", ready=ready, ready_s=120))
        url = f"http://127.0.0.1:{port}"
        assert json.loads(procs[0].ready_line) == {"api": "ready", "url": url}, "the API says where it listens"
        wait_until(lambda: _healthy(url), 60, every_s=0.2, what="the API")
        yield {"env": env, "url": url, "key": json.loads(issued.stdout)["api_key"], "procs": procs}
    finally:
        for proc in reversed(procs):
            proc.stop()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_batch_cli_submits_waits_with_progress_and_downloads(embedded_platform, tmp_path):
    p = embedded_platform
    lines = [{"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "tiny", "messages": [{"role": "user", "content": f"Item {i}"}], "max_tokens": 6}}
             for i in range(7)]
    source = tmp_path / "requests.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines) + "not json\n")
    auth = ["--api-url", p["url"], "--api-key", p["key"]]
    submitted = subprocess.run([*CLI, "batch", *auth, "submit", str(source), "--wait"], env=p["env"], timeout=300,
                               capture_output=True, text=True)
    assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    job = json.loads(submitted.stdout)
    assert job["status"] == "completed" and job["request_counts"] == {"total": 8, "completed": 7, "failed": 1}
    assert "req" in submitted.stderr and "tok/s" in submitted.stderr  # the progress bar
    # The platform's first batch waits for its worker to load the model, and says so meanwhile.
    assert "in_progress (starting the batch engine)" in submitted.stderr, submitted.stderr[-2000:]
    status = subprocess.run([*CLI, "batch", *auth, "status", job["id"]], env=p["env"], timeout=60,
                            capture_output=True, text=True)
    assert json.loads(status.stdout)["status"] == "completed"
    out_dir = tmp_path / "out"
    downloaded = subprocess.run([*CLI, "batch", *auth, "download", job["id"], "-o", str(out_dir)], env=p["env"],
                                timeout=60, capture_output=True, text=True)
    assert downloaded.returncode == 0, downloaded.stderr
    files = json.loads(downloaded.stdout)
    output = [json.loads(line) for line in Path(files["output_file_id"]).read_text().splitlines()]
    assert sorted(o["custom_id"] for o in output) == sorted(line["custom_id"] for line in lines)
    errors = [json.loads(line) for line in Path(files["error_file_id"]).read_text().splitlines()]
    assert [e["error"]["code"] for e in errors] == ["invalid_json"]
    cancelled = subprocess.run([*CLI, "batch", *auth, "cancel", job["id"]], env=p["env"], timeout=60,
                               capture_output=True, text=True)
    assert cancelled.returncode != 0 and "409" in cancelled.stderr
    worker_log = p["procs"][2].output()
    assert "celery@" in worker_log and "succeeded" in worker_log  # the chunks ran in the Celery pool
