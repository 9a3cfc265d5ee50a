"""The platform as deployed, for benchmarks: `ledgerlm serve admission`, `python -m workers
serve worker` (with an engine of its own) and `ledgerlm serve api`, each its own process,
so no two components share an interpreter lock."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PROCESSES = {"worker": ["-m", "workers", "serve", "worker"], "admission": ["-m", "api.cli", "serve", "admission"],
             "api": ["-m", "api.cli", "serve", "api"]}


def role_of(cmdline: list[str]) -> str | None:
    """Which of the deployed processes (`PROCESSES`) a command line starts, if any."""
    cmd = " ".join(cmdline)
    return next((role for role in PROCESSES if f"serve {role}" in cmd), None)


# What a benchmark's CPU setting means (`--cpus`, `--platform-cpus`).
CPUS_HELP = ("auto: unset, so the worker keeps off its engine's CPUs and the API and admission go where it says; "
             "all: no placement")


def cpus_environment(cpus: str) -> dict[str, str]:
    """The processes' environment for a benchmark's CPU setting ("auto": `LEDGERLM_CPUS` unset)."""
    return {} if cpus == "auto" else {"LEDGERLM_CPUS": cpus}


@dataclass
class Deployed:
    base_url: str
    log: object  # an EventLog handle of the bench's own on the platform's log
    view: object  # the registry, for tenants and keys
    env: dict | None = None  # the processes' environment, to launch another of them

    def tenant(self) -> tuple[str, str]:
        """A new tenant and a key of it: (tenant_id, secret)."""
        from tests.harness import new_tenant

        return new_tenant(self.view, actor="bench")


@contextmanager
def deployed(path: str, model: Path, home: Path, *, max_seqs: int, take_ahead: int, stream_linger_ms: float,
             worker_admits: bool = False, environment: dict[str, str] | None = None):
    """Starts the three processes on the embedded log under `home` or on a fresh namespace of
    the Kafka at LEDGERLM_TEST_KAFKA (`path`), waits until they serve, yields a `Deployed`,
    and stops them (any that exited early is an error). With `worker_admits` there are two:
    the worker runs admission too (`serve worker --admit`). `environment` is added to the
    processes' own last."""
    from api.demo import _wait_http, beside_worker
    from models.settings import Settings
    from pipelines.admin import commands as admin
    from pipelines.bootstrap import open_log
    from tests.harness import MODEL_ALIAS, free_port
    from tests.helpers import Launched

    home.mkdir(parents=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LEDGERLM_HOME": str(home), "LEDGERLM_MODEL": str(model),
           "LEDGERLM_MODEL_ALIAS": MODEL_ALIAS, "LEDGERLM_MAX_MODEL_LEN": "512", "LEDGERLM_KV_CACHE_GB": "0.25",
           "LEDGERLM_ENGINE_MAX_SEQS": str(max_seqs), "LEDGERLM_WORKER_TAKE_AHEAD": str(take_ahead),
           "LEDGERLM_API_PORT": str(free_port()), "LEDGERLM_GRACE_S": "30", "LEDGERLM_DEFAULT_DEADLINE_MS": "300000",
           "LEDGERLM_STREAM_LINGER_MS": str(stream_linger_ms), "LEDGERLM_WORKER_ADMITS": str(int(worker_admits)),
           **(environment or {})}
    if path == "kafka":
        env["LEDGERLM_EVENT_LOG_URL"] = os.environ["LEDGERLM_TEST_KAFKA"]
        env["LEDGERLM_EVENT_LOG_NAMESPACE"] = f"bench{uuid.uuid4().hex[:8]}"
    else:
        env.pop("LEDGERLM_EVENT_LOG_URL", None)
        env.pop("LEDGERLM_EVENT_LOG_NAMESPACE", None)
    settings = Settings(**{k[len("LEDGERLM_"):].lower(): v for k, v in env.items()
                           if k.startswith("LEDGERLM_") and not k.startswith("LEDGERLM_TEST_")})
    subprocess.run([sys.executable, "-m", "workers", "model", "approve"], env=env, check=True, timeout=600,
                   capture_output=True)
    children: list = []
    log = open_log(settings)
    # The processes lead sessions of their own, so a signal to the bench would not reach
    # them: a SIGTERM ends the bench through the `finally` below, which stops them.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        # The worker first: the API and admission go on the CPUs it leaves its engine, as
        # the README says to deploy them on a host they share.
        for name, argv in PROCESSES.items():
            if worker_admits and name == "admission":
                continue
            ready = '"ready": true' if name == "worker" else None
            children.append(Launched([sys.executable, *argv], env=env, log=home / f"{name}.log", ready=ready,
                                     ready_s=300, stop_s=60))
            if ready:
                env = beside_worker(env, json.loads(children[-1].ready_line))
        base = f"http://127.0.0.1:{env['LEDGERLM_API_PORT']}"
        _wait_http(base + "/healthz", 60)
        yield Deployed(base, log, admin.RegistryView(log), env)
        for child in children:
            child.check()
    finally:
        for child in reversed(children):
            child.stop()
        log.close()
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)
