"""A tenant downloads a summarization's Parquet output through the API, with
`ledgerlm batch download summ_... -o DIR`, and sees it in `ledgerlm batch list`; another
tenant's job is not found, and a job still running has nothing to download yet."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from api.cli import batch as batch_cli
from models import batch_keys as keys
from tests.harness import MODEL_ALIAS
from tests.helpers import wait_until
from tests.integration.test_batch_summarization import fetch, put_parquet, text

pytest_plugins = ["tests.integration.batch_fixtures"]


def cli(platform, secret: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "api.cli", "batch", "--api-url", platform.base_url, "--api-key",
                           secret, *argv], capture_output=True, text=True, timeout=120)


def download_now(platform, secret: str, job_id: str, directory: Path) -> str:
    """`batch download` run in this process, so it asks while the job has just begun."""
    args = argparse.Namespace(api_url=platform.base_url, api_key=secret, action="download", id=job_id,
                              output_dir=directory)
    with pytest.raises(SystemExit) as refused:
        batch_cli.run(platform.settings, args)
    return str(refused.value)


def submit(platform, http, tenant: str, n_docs: int) -> str:
    key = keys.tenant_prefix(tenant) + "inputs/download.parquet"
    put_parquet(platform.store, key, [{"id": f"d{i}", "text": text(30, start=i * 40)} for i in range(n_docs)])
    created = http.post("/v1/summarizations", json={"model": MODEL_ALIAS, "input_url": platform.store.uri(key),
                                                    "max_output_tokens": 8})
    assert created.status_code == 200, created.text
    return created.json()["id"]


def submit_batch(http) -> str:
    line = {"custom_id": "c0", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}}
    upload = http.post("/v1/files", files={"file": ("in.jsonl", json.dumps(line) + "\n")}, data={"purpose": "batch"})
    assert upload.status_code == 200, upload.text
    created = http.post("/v1/batches", json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions",
                                             "completion_window": "24h"})
    assert created.status_code == 200, created.text
    return created.json()["id"]


def test_a_tenant_downloads_its_summarization_parquet_into_the_folder_it_names(batch_platform, tmp_path):
    tenant, secret = batch_platform.tenant()
    _, other_secret = batch_platform.tenant()
    target = tmp_path / "new" / "out"
    with batch_platform.http(secret) as http:
        job_id = submit(batch_platform, http, tenant, n_docs=5)
        early = http.get(f"/v1/summarizations/{job_id}/output")
        refused = download_now(batch_platform, secret, job_id, target)
        assert early.status_code == 409 and early.json()["error"]["code"] == "output_not_ready", early.text
        assert refused.startswith("error 409: output_not_ready: ") and "\n" not in refused, refused
        assert not target.exists(), "nothing is written for a job that has not ended"
        job = batch_platform.wait_terminal(lambda: fetch(http, job_id)).body
        assert job["status"] == "completed", job
        listing = http.get(f"/v1/summarizations/{job_id}/output").json()
        # created_at is in whole seconds: the newer job is made in a later one, so the order is known
        wait_until(lambda: int(time.time()) > job["created_at"], 5, every_s=0.05, what="the next second")
        batch_id = submit_batch(http)  # a newer job of the other kind, for the listing's order
    assert listing["manifest"]["rows"] == 5 and listing["data"], listing

    done = cli(batch_platform, secret, "download", job_id, "-o", str(target))
    assert done.returncode == 0, done.stderr
    written = [Path(p) for p in done.stdout.split()]
    assert sorted(p.name for p in written) == sorted(part["name"] for part in listing["data"])
    assert all(p.parent == target and p.stat().st_size > 0 for p in written)
    table = pq.read_table(target)
    assert sorted(table.column("id").to_pylist()) == [f"d{i}" for i in range(5)]
    assert all(n > 0 for n in table.column("output_tokens").to_pylist())

    with batch_platform.http(other_secret) as http:
        for path in (f"/v1/summarizations/{job_id}/output", f"/v1/summarizations/{job_id}/output/{written[0].name}"):
            assert http.get(path).status_code == 404
    foreign = cli(batch_platform, other_secret, "download", job_id, "-o", str(tmp_path / "theirs"))
    assert foreign.returncode != 0 and foreign.stderr.strip().startswith("error 404:"), foreign.stderr
    assert len(foreign.stderr.strip().splitlines()) == 1 and not (tmp_path / "theirs").exists()

    listed = cli(batch_platform, secret, "list")
    assert listed.returncode == 0, listed.stderr
    jobs = [json.loads(x) for x in listed.stdout.splitlines()]
    assert [(j["id"], j["kind"]) for j in jobs] == [(batch_id, "batch"), (job_id, "summarization")]
