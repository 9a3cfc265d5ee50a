"""`ledgerlm batch ...`: batch jobs from the command line, through the HTTP API.

    ledgerlm batch submit FILE [--endpoint /v1/chat/completions] [--wait]
    ledgerlm batch summarize (FILE | s3://...) --model ALIAS [--template T] [--wait]
    ledgerlm batch status ID | cancel ID | download ID [-o DIR] | list

The key comes from --api-key or LEDGERLM_API_KEY, the server from --api-url,
LEDGERLM_API_URL or the settings' api_host and api_port. The long-running processes
`ledgerlm serve batch-dispatcher` and `ledgerlm serve batch-worker` are `api.cli.processes`'.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from models.settings import Settings

TERMINAL = {"completed", "failed", "expired", "cancelled"}


def register(subparsers) -> dict:
    batch = subparsers.add_parser("batch", help="offline batch and summarization jobs")
    batch.add_argument("--api-url", default=os.environ.get("LEDGERLM_API_URL"))
    batch.add_argument("--api-key", default=os.environ.get("LEDGERLM_API_KEY"))
    sub = batch.add_subparsers(dest="action", required=True)
    submit = sub.add_parser("submit", help="upload a JSONL file of requests and start a batch")
    submit.add_argument("file", type=Path)
    submit.add_argument("--endpoint", default="/v1/chat/completions",
                        choices=["/v1/chat/completions", "/v1/completions"])
    submit.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    submit.add_argument("--wait", action="store_true", help="follow progress until the batch ends")
    summarize = sub.add_parser("summarize", help="summarize the id,text rows of a Parquet or JSONL input")
    summarize.add_argument("input", help="a local file to upload, or an s3:// URL under your prefix")
    summarize.add_argument("--model", required=True)
    summarize.add_argument("--template", help="prompt template containing {text}")
    summarize.add_argument("--max-output-tokens", type=int, default=128)
    summarize.add_argument("--wait", action="store_true")
    for name in ("status", "cancel"):
        sub.add_parser(name).add_argument("id")
    download = sub.add_parser("download", help="save a batch's output and error files, or a "
                              "summarization's Parquet parts, into -o DIR")
    download.add_argument("id")
    download.add_argument("-o", "--output-dir", type=Path, default=Path("."))
    sub.add_parser("list")
    return {"batch": run}


def _client(settings: Settings, args):
    import httpx

    if not args.api_key:
        raise SystemExit("error: give an API key with --api-key or LEDGERLM_API_KEY")
    url = args.api_url or f"http://{settings.api_host}:{settings.api_port}"
    return httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {args.api_key}"}, timeout=300)


def _check(response):
    if response.status_code >= 400:
        try:
            error = response.json()["error"]
            message = f"{error.get('code')}: {error.get('message')}"
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        raise SystemExit(f"error {response.status_code}: {message}")
    return response


def _path_of(job_id: str) -> str:
    return "/v1/summarizations" if job_id.startswith("summ_") else "/v1/batches"


def progress_line(job: dict, started: dict, elapsed_s: float) -> dict:
    """What the progress bar shows: requests done of total, output tokens per second."""
    counts = job.get("request_counts") or {}
    out_tokens = (job.get("usage") or {}).get("output_tokens", 0)
    rate = (out_tokens - started.get("output_tokens", 0)) / elapsed_s if elapsed_s > 0 else 0.0
    return {"done": counts.get("completed", 0) + counts.get("failed", 0), "total": counts.get("total", 0),
            "tokens_per_s": rate, "status": job["status"], "detail": job.get("status_detail")}


def follow(client, job_id: str, *, interval_s: float = 1.0, out=sys.stderr) -> dict:
    """Polls the job until it ends, drawing requests done, tokens/s and the ETA."""
    from tqdm import tqdm

    began, started = time.monotonic(), None
    with tqdm(total=0, unit="req", file=out, dynamic_ncols=True) as bar:
        while True:
            job = _check(client.get(f"{_path_of(job_id)}/{job_id}")).json()
            if started is None:
                started = dict(job.get("usage") or {})
            line = progress_line(job, started, time.monotonic() - began)
            if line["total"] and bar.total != line["total"]:
                bar.total = line["total"]
                bar.refresh()
            bar.update(line["done"] - bar.n)
            status = f"{line['status']} ({line['detail']})" if line["detail"] else line["status"]
            bar.set_postfix_str(f"{status}, {line['tokens_per_s']:.0f} tok/s")
            if job["status"] in TERMINAL:
                return job
            time.sleep(interval_s)  # a poll interval, not synchronisation


def _upload(client, path: Path, purpose: str = "batch") -> dict:
    with path.open("rb") as f:
        return _check(client.post("/v1/files", files={"file": (path.name, f)}, data={"purpose": purpose})).json()


def run(settings: Settings, args: argparse.Namespace) -> int:
    with _client(settings, args) as client:
        if args.action == "submit":
            upload = _upload(client, args.file)
            metadata = dict(m.split("=", 1) for m in args.metadata if "=" in m)
            job = _check(client.post("/v1/batches", json={
                "input_file_id": upload["id"], "endpoint": args.endpoint, "completion_window": "24h",
                "metadata": metadata or None})).json()
        elif args.action == "summarize":
            body = {"model": args.model, "max_output_tokens": args.max_output_tokens}
            if args.template:
                body["prompt_template"] = args.template
            if "://" in args.input:
                body["input_url"] = args.input
            else:
                body["input_file_id"] = _upload(client, Path(args.input))["id"]
            job = _check(client.post("/v1/summarizations", json=body)).json()
        elif args.action == "status":
            job = _check(client.get(f"{_path_of(args.id)}/{args.id}")).json()
        elif args.action == "cancel":
            job = _check(client.post(f"{_path_of(args.id)}/{args.id}/cancel")).json()
        elif args.action == "list":
            for item in list_jobs(client):
                print(json.dumps(item))
            return 0
        else:
            return _download(client, args.id, args.output_dir)
        if getattr(args, "wait", False):
            job = follow(client, job["id"])
        print(json.dumps(job, indent=2))
        return 0 if job["status"] not in ("failed", "expired") else 1


def list_jobs(client, limit: int = 100) -> list[dict]:
    """The tenant's batches and summarizations together, newest first, as the API orders a page."""
    jobs = [{"kind": kind, **item} for kind, path in (("batch", "/v1/batches"), ("summarization", "/v1/summarizations"))
            for item in _check(client.get(path, params={"limit": limit})).json()["data"]]
    jobs.sort(key=lambda j: (j["created_at"] or 0, j["id"]), reverse=True)
    return [{k: j.get(k) for k in ("id", "kind", "status", "request_counts", "created_at")} for j in jobs[:limit]]


def _make_dir(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"error: cannot use {directory} as the output folder: {exc.strerror or exc}") from None


def _save(client, url: str, target: Path) -> None:
    with client.stream("GET", url) as response:
        _check(response)
        with target.open("wb") as f:
            for block in response.iter_bytes():
                f.write(block)


def _download_summarization(client, job_id: str, directory: Path) -> int:
    """Writes the job's Parquet parts into `directory`, one path printed per part."""
    parts = _check(client.get(f"/v1/summarizations/{job_id}/output")).json()["data"]
    _make_dir(directory)
    for part in parts:
        target = directory / Path(part["name"]).name
        _save(client, part["url"], target)
        print(target)
    if not parts:
        print(f"summarization {job_id} ended with no output rows", file=sys.stderr)
    return 0


def _download(client, job_id: str, directory: Path) -> int:
    if job_id.startswith("summ_"):
        return _download_summarization(client, job_id, directory)
    job = _check(client.get(f"/v1/batches/{job_id}")).json()
    _make_dir(directory)
    saved = {}
    for field in ("output_file_id", "error_file_id"):
        if file_id := job.get(field):
            target = directory / f"{job_id}_{field.removesuffix('_file_id')}.jsonl"
            _save(client, f"/v1/files/{file_id}/content", target)
            saved[field] = str(target)
    if not saved:
        print(f"batch {job_id} is {job['status']} and has no files yet", file=sys.stderr)
        return 1
    print(json.dumps(saved))
    return 0
