"""`ledgerlm demo`: the platform's main job on the embedded defaults, start to finish, with
two model revisions served side by side.

Approves two revisions: SmolLM2-135M-Instruct, a real small model (prepared once under the
platform's home; `LEDGERLM_MODEL` names another directory instead), and the tiny random
model. Starts one interactive worker per revision, each engine computing on CPUs of its
own, then admission and the API, as child processes (`ledgerlm serve`, as
`api.cli.processes` declares them). Streams a chat answer from the real
model and a few tokens from the tiny one, prints the requests' events read back from the
log, and stops every child before returning. Every wait has a deadline and says what it
waits for.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import psutil

from models import topics
from models.events import decode
from models.settings import Settings, format_cpu_list
from pipelines.admin import commands as admin
from pipelines.bootstrap import Bootstrap

TENANT = "demo"
REAL_ALIAS = "smollm2"  # the alias of the real model; "model" when LEDGERLM_MODEL names another
TINY_ALIAS = "tiny"
QUESTION = "What is the capital of France, and what is one famous landmark there?"
TINY_PROMPT = "The ledger of tokens says"
KV_CACHE_GB = "0.25"  # two engines on one host: a small KV cache each, unless LEDGERLM_KV_CACHE_GB says
WORKER_READY_S = 300  # engine start and warm-up, both engines at once on a small host
STOP_S = 45  # for a serving child to stop (an engine shuts down in seconds) before it is killed


class Child:
    """A process the demo started, leading a session of its own (a Ctrl-C reaches the demo,
    which stops its children in order), its output in a file under the platform's home."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logs: Path):
        self.name = name
        self.ready = False  # set once it said it serves (or has nothing to say)
        self.log = logs / f"demo-{name}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                                         start_new_session=True)

    def tail(self, lines: int = 30) -> str:
        return "".join(self.log.read_text(errors="replace").splitlines(keepends=True)[-lines:])

    def wait_for_line(self, needle: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = next((line for line in self.log.read_text(errors="replace").splitlines() if needle in line), None)
            if found is not None:
                self.ready = True
                return found
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before it was ready "
                                   f"({self.log}):\n{self.tail()}")
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} was not ready within {timeout_s:g} s ({self.log}):\n{self.tail()}")

    def signal(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # a serving worker shuts its engine down itself

    def stop(self, deadline: float) -> None:
        """Waits until `deadline` for the child to exit, then kills whatever of its session is left."""
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of its session outlived it
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=10)


def beside_worker(env: dict[str, str], ready: dict) -> dict[str, str]:
    """The environment for the API and admission on the host of a worker that printed
    `ready`: on the CPUs the worker left its engine, unless `LEDGERLM_CPUS` says otherwise."""
    if env.get("LEDGERLM_CPUS") or not ready.get("cpus"):
        return env
    return {**env, "LEDGERLM_CPUS": ready["cpus"]}


def split_cpus(allowed: set[int]) -> tuple[str, str]:
    """(the real model's engine CPUs, the tiny model's) as vLLM's `VLLM_CPU_OMP_THREADS_BIND`
    lists. Left to itself, each vLLM CPU engine binds to the same CPUs; the tiny model, which
    idles but for one short request, gets the first CPU (the platform's threads run there
    too), the real model the rest. On one CPU they share it."""
    cpus = sorted(allowed)
    if len(cpus) == 1:
        return str(cpus[0]), str(cpus[0])
    return format_cpu_list(set(cpus[1:])), str(cpus[0])


def engine_bound_cpus(child: Child) -> set[int]:
    """The CPUs the threads of a worker's engine processes are bound to, read from /proc
    (threads free to go anywhere say nothing)."""
    allowed = os.sched_getaffinity(0)
    bound: set[int] = set()
    for process in psutil.Process(child.proc.pid).children(recursive=True):
        try:
            for thread in process.threads():
                cpus = os.sched_getaffinity(thread.id)
                if cpus < allowed:
                    bound |= cpus
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return bound


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


def _wait_fleet(base: str, secret: str, aliases: list[str], timeout_s: float) -> dict:
    """`GET /v1/models` once the API's fleet view has a live worker for every alias."""
    deadline = time.monotonic() + timeout_s
    while True:
        models = {m["id"]: m for m in httpx.get(base + "/v1/models", timeout=5,
                                                 headers={"Authorization": f"Bearer {secret}"}).json()["data"]}
        if all(models.get(a, {}).get("serving", {}).get("workers") for a in aliases):
            return models
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API saw no live worker for some of {aliases} within {timeout_s:g} s: {models}")
        time.sleep(0.3)


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


def _print_events(settings: Settings, alias: str, request_id: str, timeout_s: float = 15.0) -> dict | None:
    """Prints the request's events once it is settled (or after `timeout_s`); returns the
    payload of its `GenerationStarted`: which worker and revision ran it."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = _request_events(settings, request_id)
        if any(env.event_type == "UsageSettled" for *_, env in found) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    print(f"\n--- events of {alias}'s request {request_id} read back from the log ---")
    started = None
    tokens = [record for _, _, record, env in found if env.event_type == "TokensEmitted"]
    middle = {id(record) for record in tokens[1:-1]}  # one line for these: the text above shows them
    for _, topic_name, record, env in found:
        if id(record) in middle:
            if record is tokens[1]:
                print(f"{topic_name}[{record.partition}]@{record.offset}..{tokens[-2].offset} "
                      f"TokensEmitted x{len(tokens) - 2}")
            continue
        payload = env.payload.model_dump(mode="json")
        payload.pop("prompt", None)
        if "request" in payload:
            payload["request"] = {"request_id": payload["request"]["request_id"], "...": "..."}
        if env.event_type == "GenerationStarted":
            started = payload
        print(f"{topic_name}[{record.partition}]@{record.offset} {env.event_type} {json.dumps(payload)[:200]}")
    return started


def _stream(base: str, secret: str, path: str, body: dict, text_of) -> tuple[str, str | None]:
    """POSTs a streamed request and prints its text as it arrives: (request id, revision)."""
    revision = None
    with httpx.stream("POST", base + path, json=body, timeout=httpx.Timeout(10, read=120),
                      headers={"Authorization": f"Bearer {secret}"}) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{path}: {response.status_code} {response.read().decode()}")
        request_id = response.headers["X-Request-Id"]
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            frame = json.loads(line[6:])
            if "error" in frame:
                raise RuntimeError(f"{path}: {frame['error']}")
            revision = frame.get("system_fingerprint") or frame.get("model_revision") or revision
            print(text_of(frame), end="", flush=True)
    print()
    return request_id, revision


def _chat_text(frame: dict) -> str:
    return "".join(c.get("delta", {}).get("content") or "" for c in frame.get("choices", ()))


def _generation_text(frame: dict) -> str:
    if frame["type"] == "tokens":
        return frame["text"]
    if frame["type"] in ("completed", "failed", "cancelled"):
        return f"  [{frame['type']}: {frame.get('finish_reason')}]"
    return ""


def _stop_all(children: list[Child]) -> None:
    # All are told at once, so the engines shut down together. A worker still starting
    # finishes its engine start before it looks at the signal: it is not waited for.
    print(f"stopping the demo's {len(children)} processes ...", flush=True)
    for child in children:
        child.signal()
    now = time.monotonic()
    for child in reversed(children):
        child.stop(now + (STOP_S if child.ready else 3))


def _stop_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through the ExitStack, which stops the children


def run_demo(settings: Settings, processes: dict) -> int:
    """`processes`: the platform's, as `api.cli.processes.PROCESSES` declares them by name; the
    demo starts those on the interactive path (`Process.demo`), a worker per revision first."""
    began = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        return _run(settings, processes, began)
    except RuntimeError as exc:
        print(f"\ndemo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(settings: Settings, processes: dict, began: float) -> int:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("LEDGERLM_KV_CACHE_GB", KV_CACHE_GB)
    logs = settings.ensure_home() / "logs"
    logs.mkdir(exist_ok=True)
    real_alias, revisions = _approve_both(settings, env)
    secret = _credentials(settings)
    base = f"http://{settings.api_host}:{settings.api_port}"
    worker = processes["worker"]
    with ExitStack() as stack:
        children: list[Child] = []
        stack.callback(_stop_all, children)

        def start(name: str, argv: list[str], child_env: dict[str, str]) -> Child:
            children.append(Child(name, argv, child_env, logs))
            return children[-1]

        real_ready = _start_workers(start, worker, env, real_alias)
        _start_platform(start, [p for p in processes.values() if p.demo and p is not worker],
                        beside_worker(env, real_ready), base, secret, [real_alias, TINY_ALIAS])
        _converse(settings, base, secret, real_alias, revisions)
    print(f"done in {time.monotonic() - began:.0f} s")
    return 0


def _step(what: str, argv: list[str], env: dict[str, str], timeout_s: float) -> str:
    """Runs a command to its end; its last line of output."""
    print(f"{what} (up to {timeout_s:g} s) ...", flush=True)
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(argv[1:])} did not finish within {timeout_s:g} s") from None
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:])} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def _approve_both(settings: Settings, env: dict[str, str]) -> tuple[str, dict]:
    """Approves the real model (prepared first, unless `LEDGERLM_MODEL` names one) and the
    tiny one: (the real model's alias, what each approval printed, by alias)."""
    workers = [sys.executable, "-m", "workers"]
    real_alias = REAL_ALIAS if settings.model is None else \
        (settings.model_alias if settings.model_alias != TINY_ALIAS else "model")
    real_model = settings.model
    if real_model is None:
        real_model = _step("preparing SmolLM2-135M-Instruct (once; later runs find it prepared)",
                           [*workers, "model", "prepare-small"], env, 600)
    tiny_env = {k: v for k, v in env.items() if k != "LEDGERLM_MODEL"}
    return real_alias, {
        real_alias: json.loads(_step(f"approving {real_model} as '{real_alias}'", [*workers, "model", "approve",
                                     "--alias", real_alias], {**env, "LEDGERLM_MODEL": str(real_model)}, 300)),
        TINY_ALIAS: json.loads(_step(f"approving the tiny random model as '{TINY_ALIAS}'",
                                     [*workers, "model", "approve", "--alias", TINY_ALIAS], tiny_env, 300)),
    }


def _start_workers(start, worker, env: dict[str, str], real_alias: str) -> dict:
    """A worker per revision, each engine computing on CPUs of its own; the tiny worker's
    own threads, like the API's and admission's, run beside the tiny engine. Returns the
    real model's worker's ready line once both serve."""
    real_cpus, tiny_cpus = split_cpus(os.sched_getaffinity(0))
    real = start(f"worker-{real_alias}", worker.argv("--alias", real_alias),
                 {**env, "VLLM_CPU_OMP_THREADS_BIND": real_cpus})
    tiny = start("worker-tiny", worker.argv("--alias", TINY_ALIAS),
                 {"LEDGERLM_CPUS": tiny_cpus, **env, "VLLM_CPU_OMP_THREADS_BIND": tiny_cpus})
    print(f"waiting for two workers to load and warm their engines ('{real_alias}' on CPU {real_cpus}, "
          f"'{TINY_ALIAS}' on CPU {tiny_cpus}; up to {WORKER_READY_S} s) ...", flush=True)
    deadline = time.monotonic() + WORKER_READY_S
    real_ready = json.loads(real.wait_for_line(worker.ready_says, deadline - time.monotonic()))
    tiny.wait_for_line(worker.ready_says, max(1.0, deadline - time.monotonic()))
    print(f"engines compute on CPUs: '{real_alias}' {format_cpu_list(engine_bound_cpus(real)) or 'any'}, "
          f"'{TINY_ALIAS}' {format_cpu_list(engine_bound_cpus(tiny)) or 'any'} (bound threads, from /proc)")
    return real_ready


def _start_platform(start, processes: list, env: dict[str, str], base: str, secret: str,
                    aliases: list[str]) -> None:
    """The rest of the interactive path (admission and the API), until the API's view of
    the fleet has a live worker for every alias."""
    for process in processes:
        child = start(process.name, process.argv(), env)
        if process.ready_says:
            child.wait_for_line(process.ready_says, 60)
        else:
            child.ready = True  # it stops cleanly on a signal at any time
    print(f"waiting for the API at {base} and its view of the fleet (up to 60 s) ...", flush=True)
    _wait_http(base + "/healthz", 60)
    fleet = _wait_fleet(base, secret, aliases, 30)
    for alias in aliases:
        serving = fleet[alias]["serving"]
        print(f"fleet: '{alias}' -> {fleet[alias]['model_revision']} "
              f"({serving['workers']} worker, {serving['free_slots']} free slots)")


def _converse(settings: Settings, base: str, secret: str, real_alias: str, revisions: dict) -> None:
    """A chat with the real model and a few tokens of the tiny one, streamed, then each
    request's events read back from the log and where it ran."""
    print(f"\n--- {real_alias} ({revisions[real_alias]['model_revision']}): chat, greedy ---")
    print(f"user: {QUESTION}\nassistant: ", end="", flush=True)
    real_request, _ = _stream(base, secret, "/v1/chat/completions", {
        "model": real_alias, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 48,
        "temperature": 0, "stream": True}, _chat_text)
    print(f"\n--- {TINY_ALIAS} ({revisions[TINY_ALIAS]['model_revision']}): random weights, so noise ---")
    print(f"{TINY_PROMPT}", end="", flush=True)
    tiny_request, _ = _stream(base, secret, "/v1/generations", {
        "model_alias": TINY_ALIAS, "input": TINY_PROMPT, "max_output_tokens": 12, "temperature": 0,
        "stream": True}, _generation_text)
    ran = {alias: _print_events(settings, alias, request_id)
           for alias, request_id in ((real_alias, real_request), (TINY_ALIAS, tiny_request))}
    print()
    for alias, started in ran.items():
        if started is None:
            raise RuntimeError(f"no GenerationStarted for {alias}'s request")
        print(f"'{alias}' ran on worker {started['worker_id']}, revision {started['model_revision']}")
