"""`ledgerlm demo`: the platform's main job on the embedded defaults, start to finish.

Starts the admission processor, one interactive worker and the API as child processes,
streams one generation through HTTP, prints the request's events read back from the
log, and stops every child before returning.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack

import httpx

from models import topics
from models.events import decode
from models.settings import Settings
from pipelines import admin
from pipelines.bootstrap import Bootstrap

TENANT = "demo"


class Child:
    def __init__(self, name: str, argv: list[str], env: dict[str, str]):
        self.name = name
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)

    def wait_for_line(self, needle: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        os.set_blocking(self.proc.stdout.fileno(), False)
        seen = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line:
                seen.append(line)
                if needle in line:
                    return line
                continue
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not become ready:\n{''.join(seen[-30:])}")

    def stop(self, timeout_s: float = 20) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


def beside_worker(env: dict[str, str], ready: dict) -> dict[str, str]:
    """The environment for the API and admission on the host of a worker that printed
    `ready`: on the CPUs the worker left its engine, unless `LEDGERLM_CPUS` says otherwise."""
    if env.get("LEDGERLM_CPUS") or not ready.get("cpus"):
        return env
    return {**env, "LEDGERLM_CPUS": ready["cpus"]}


def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s}s")


def _credentials(settings: Settings) -> str:
    platform = Bootstrap(settings)
    with platform.event_log() as log:
        view = platform.registry_view(log)
        if TENANT not in view.refresh().tenants:
            admin.create_tenant(view, tenant_id=TENANT, name="Demo team", actor="demo")
        secret, _ = admin.issue_key(view, tenant_id=TENANT, actor="demo")
    return secret


def _request_events(settings: Settings, request_id: str) -> list:
    found = []
    with Bootstrap(settings).event_log() as log:
        for topic in topics.ALL:
            for record in log.read_topic(topic.name):
                env = decode(record.value)
                if env.correlation_id == request_id:
                    found.append((env.occurred_at, topic.name, record, env))
    # Events stamped with the same time are shown in the order the request flows.
    flow = [topics.PROMPTS.name, topics.REQUESTS.name, topics.LEDGER.name]
    return sorted(found, key=lambda f: (f[0], flow.index(f[1]) if f[1] in flow else len(flow)))


def _print_events(settings: Settings, request_id: str, timeout_s: float = 15.0) -> None:
    # The settlement follows the terminal event; wait for it, within a bound.
    deadline = time.monotonic() + timeout_s
    while True:
        found = _request_events(settings, request_id)
        if any(env.event_type == "UsageSettled" for *_, env in found) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    print("\n--- events of", request_id, "read back from the log ---")
    for _, topic_name, record, env in found:
        payload = env.payload.model_dump(mode="json")
        payload.pop("prompt", None)
        if "request" in payload:
            payload["request"] = {"request_id": payload["request"]["request_id"], "...": "..."}
        print(f"{topic_name}[{record.partition}]@{record.offset} {env.event_type} {json.dumps(payload)[:160]}")


def run_demo(settings: Settings) -> int:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    py = sys.executable
    ledgerlm = [py, "-m", "api.cli"]
    subprocess.run([py, "-m", "workers", "model", "approve"], env=env, check=True, timeout=600)
    secret = _credentials(settings)
    base = f"http://{settings.api_host}:{settings.api_port}"
    with ExitStack() as stack:
        # The worker first: admission and the API then run on the CPUs it leaves its engine.
        for name, argv in [("worker", [py, "-m", "workers", "serve", "worker"]),
                           ("admission", [*ledgerlm, "serve", "admission"]),
                           ("api", [*ledgerlm, "serve", "api"])]:
            child = Child(name, argv, env)
            stack.callback(child.stop)
            if name == "worker":
                env = beside_worker(env, json.loads(child.wait_for_line('"ready": true', timeout_s=300)))
        _wait_http(base + "/healthz", 60)
        body = {"model_alias": settings.model_alias, "input": "The ledger of tokens says", "max_output_tokens": 32,
                "stream": True}
        request_id = None
        print("--- streaming tokens ---")
        with httpx.stream("POST", base + "/v1/generations", json=body, timeout=120,
                          headers={"Authorization": f"Bearer {secret}"}) as response:
            if response.status_code != 200:
                print(f"error {response.status_code}: {response.read().decode()}", file=sys.stderr)
                return 1
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                frame = json.loads(line[6:])
                request_id = frame["request_id"]
                if frame["type"] == "tokens":
                    print(frame["text"], end="", flush=True)
                elif frame["type"] != "started":
                    print(f"\n[{frame['type']}] {json.dumps({k: frame[k] for k in frame if k in ('finish_reason', 'usage', 'model_revision')})}")
        _print_events(settings, request_id)
    return 0
