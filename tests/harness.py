"""A whole platform in one test process: admission, an interactive worker on the shared
engine, and the HTTP API served by uvicorn on a loopback port.

Admission and the workers are the platform's own processes (`api.cli.processes`), each run
in a thread by the loop `ledgerlm serve NAME` runs it with (`ProcessThread`); a worker is
handed the session's running engine instead of starting one. Each component gets its own
`EventLog` instances, as separate processes would. Waiting on a condition and launching a
process of the platform are `tests.helpers` (`wait_until`, `Launched`), which this module
builds on.
"""
from __future__ import annotations

import socket
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
import uvicorn

from api.app import create_app
from api.cli.processes import PROCESSES, arguments, run
from api.deps import Services
from api.process_kit import Started
from api.stream_hub import StreamHub
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.admin.commands import RegistryView
from pipelines.bootstrap import Bootstrap, topic_specs
from pipelines.eventlog import EventLog
from pipelines.eventlog.kafka_clients import close_all
from pipelines.generation.tokencount import TokenCounter
from tests.helpers import wait_until
from workers.engine_runner import EngineRunner
from workers.interactive import InteractiveWorker

MODEL_ALIAS = "tiny"


def open_isolated_log(kind: str, home: Path, *, kafka_url: str = "", namespace: str = "") -> EventLog:
    """A handle onto one isolated log, opened through the bootstrap: the embedded one under
    `home`, or `namespace` on the Kafka at `kafka_url`. Plain arguments, so another process
    can open the same log."""
    url = f"sqlite:///{Path(home) / 'eventlog.db'}" if kind == "embedded" else kafka_url
    settings = Settings(home=home, event_log_url=url, event_log_namespace="" if kind == "embedded" else namespace)
    return Bootstrap(settings).event_log(create_topics=False)


def isolated_log_opener(kind: str, home: Path, *, kafka_url: str = "", prefix: str = "t") -> Callable[[], EventLog]:
    """A function opening fresh handles onto one isolated log: an embedded one under `home`,
    or a new namespace (`prefix` + random) on the Kafka at `kafka_url`. Topics are made."""
    namespace = "" if kind == "embedded" else prefix + uuid.uuid4().hex[:12]
    open_fresh = lambda: open_isolated_log(kind, home, kafka_url=kafka_url, namespace=namespace)  # noqa: E731
    first = open_fresh()
    first.ensure_topics(topic_specs())
    first.close()
    return open_fresh


def new_tenant(view: RegistryView, *, scopes: tuple[str, ...] = ("generate", "batch", "usage"),
               application: str = "default", actor: str = "tests", **limits) -> tuple[str, str]:
    """A new tenant and an API key for it, written through `view`: (tenant_id, secret).
    `limits` are set first (`may_send_high=True` for a tenant that sends priority high)."""
    tenant_id = "t" + uuid.uuid4().hex[:10]
    admin.create_tenant(view, tenant_id=tenant_id, name=tenant_id, actor=actor)
    if limits:
        admin.set_limits(view, tenant_id=tenant_id, actor=actor, **limits)
    secret, _ = admin.issue_key(view, tenant_id=tenant_id, actor=actor, scopes=scopes, application_id=application)
    return tenant_id, secret


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api_services(settings: Settings, log: EventLog) -> Services:
    """What one API process holds, on its own log handle `log`."""
    return Services(settings=settings, log=log, registry_view=RegistryView(log), counter=TokenCounter(),
                    hub=StreamHub(log, idle_wait_s=0.02))


def serve_api(app, name: str, **config) -> tuple[uvicorn.Server, threading.Thread, int]:
    """`app` served by uvicorn on a free loopback port, in a thread named `name`; returns
    (server, thread, port) once it serves. Stop it with `server.should_exit = True`."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 30, what=f"the API server {name} to start")
    assert server.started, f"the API server {name} stopped before it served"
    return server, thread, port


@dataclass
class Loop:
    """A component's `run_once` called in a thread until stopped."""

    name: str
    run_once: Callable[[], object]
    close: Callable[[], object]
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    error: BaseException | None = None

    def start(self) -> "Loop":
        def run():
            try:
                while not self.stop.is_set():
                    self.run_once()
            except BaseException as exc:  # surfaced by Platform.check()
                self.error = exc
            finally:
                self.close()

        self.thread = threading.Thread(target=run, name=self.name, daemon=True)
        self.thread.start()
        return self

    def halt(self, timeout_s: float = 30.0) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout_s)


class ProcessThread:
    """A process of the platform (`api.cli.processes.PROCESSES[name]`) run in a thread of
    the test process by the loop `ledgerlm serve NAME` runs it with, signals aside: `halt`
    sets its stop event. `given` goes to its start (a worker's running engine, its name).
    Returns once it serves (`started`, with the component it runs as `main`), raising what
    it failed to start on; `error` is what its run stopped on, if anything. A `Loop` to
    `Platform`: `halt`, `error`, `worker`."""

    def __init__(self, process: str, settings: Settings, args, *, open_log: Callable[[], EventLog],
                 name: str | None = None, start_s: float = 120.0, **given):
        self.name = name or process
        self.stop = threading.Event()
        self.started: Started | None = None
        self.error: BaseException | None = None
        self.exit_code: int | None = None
        serving = threading.Event()

        def on_started(started: Started) -> None:
            self.started = started
            serving.set()

        def serve() -> None:
            try:
                self.exit_code = run(PROCESSES[process], settings, args, self.stop, open_log=open_log, given=given,
                                     started=on_started)
            except BaseException as exc:  # surfaced by Platform.check(), or here while it starts
                self.error = exc
            finally:
                serving.set()

        self.thread = threading.Thread(target=serve, name=self.name, daemon=True)
        self.thread.start()
        if not serving.wait(start_s):
            self.halt()
            raise AssertionError(f"{self.name} did not start within {start_s:g} s")
        if self.started is None:
            raise AssertionError(f"{self.name} failed to start: {self.error!r}") from self.error

    @property
    def worker(self):
        return self.started.main

    def halt(self, timeout_s: float = 30.0) -> None:
        self.stop.set()
        self.thread.join(timeout_s)


class Platform:
    def __init__(self, open_log: Callable[[], EventLog], runner: EngineRunner, settings: Settings,
                 *, max_in_flight: int = 8, take_ahead: int | None = 0, worker_admits: bool = False):
        self.open_log, self.runner, self.settings = open_log, runner, settings
        self.logs: list[EventLog] = []
        self.loops: list[ProcessThread | Loop] = []
        self._server_thread: threading.Thread | None = None
        try:
            self._start(max_in_flight=max_in_flight, take_ahead=take_ahead, worker_admits=worker_admits)
        except BaseException:
            self.close()  # what it got to: nothing of a platform that failed to start stays running
            raise

    def _start(self, *, max_in_flight: int, take_ahead: int | None, worker_admits: bool) -> None:
        self.admin_log = self._log()
        self.view = RegistryView(self.admin_log)
        engine = self.runner.engine
        self.model_revision = f"tiny@{engine.engine_config_hash()}"
        admin.approve_model(self.view, alias=MODEL_ALIAS, model_revision=self.model_revision,
                            model_path=str(engine.config.model), engine_config_hash=engine.engine_config_hash(),
                            max_model_len=engine.config.max_model_len, actor="tests",
                            price_input_per_1k_micros=1000, price_output_per_1k_micros=2000)
        if worker_admits:  # admission runs in the worker's process, handing it what can start at once
            self.start_worker(max_in_flight=max_in_flight, take_ahead=take_ahead, admits=True)
        else:
            self.start_admission()
            self.start_worker(max_in_flight=max_in_flight, take_ahead=take_ahead)
        self._start_api()

    def _log(self) -> EventLog:
        log = self.open_log()
        self.logs.append(log)
        return log

    def start_admission(self, taker=None) -> ProcessThread:
        """`ledgerlm serve admission` (handing what can start at once to `taker`, if given)."""
        process = ProcessThread("admission", self.settings, arguments("admission"), open_log=self.open_log,
                                taker=taker)
        self.admission = process.started.main
        self.loops.append(process)
        return process

    def start_worker(self, *, max_in_flight: int = 8, take_ahead: int | None = 0, pool: str | None = None,
                     log: EventLog | None = None, close: Callable[[], object] | None = None,
                     engine=None, runner: EngineRunner | None = None, revision: str | None = None,
                     admits: bool = False) -> ProcessThread | Loop:
        """`ledgerlm serve worker [--pool POOL] [--admit]` on the shared engine (`pool` None:
        the shared pool, which `self.worker` names), serving the platform's revision unless
        told another (`revision`, with the `runner` of its engine); `engine` wraps the shared
        one (it must run on the shared engine's loop). With `admits`, admission runs beside it
        (`self.admission`). A worker that must die as a crash does is built by hand: `close`
        replaces its orderly close (its heartbeats stop too), and a crash whose group
        membership must outlive it brings its own `log`."""
        runner = runner or self.runner
        if log is not None or close is not None:
            loop = self._crashable_worker(runner, engine or runner.engine, max_in_flight=max_in_flight,
                                          take_ahead=take_ahead, pool=pool, log=log, close=close,
                                          revision=revision or self.model_revision)
        else:
            settings = self.settings.model_copy(update={"engine_max_seqs": max_in_flight,
                                                        "worker_take_ahead": take_ahead})
            flags = [*(["--pool", pool] if pool else []), *(["--admit"] if admits else [])]
            loop = ProcessThread("worker", settings, arguments("worker", *flags), open_log=self.open_log,
                                 name=f"worker-{pool or 'shared'}", runner=runner,
                                 revision=revision or self.model_revision,
                                 worker_id=f"test-worker-{uuid.uuid4().hex[:6]}", engine=engine)
            if admits:
                self.admission = loop.started.parts["admission"]
        if pool is None and revision is None:
            self.worker = loop.worker
        self.loops.append(loop)
        return loop

    def _crashable_worker(self, runner: EngineRunner, engine, *, max_in_flight: int, take_ahead: int | None,
                          pool: str | None, log: EventLog | None, close: Callable[[], object] | None,
                          revision: str) -> Loop:
        """A worker built by hand, whose end is `close` (None: its orderly close). The log
        handles it opens are closed when its loop ends, after `close`."""
        opened: list[EventLog] = []
        try:
            opened.append(self.open_log())  # the cancel watch's
            if log is None:
                opened.append(self.open_log())
            worker = InteractiveWorker(log or opened[-1], runner, engine, max_in_flight=max_in_flight,
                                       take_ahead=take_ahead, worker_id=f"test-worker-{uuid.uuid4().hex[:6]}",
                                       pool=pool, cancel_log=opened[0],
                                       stream_linger_s=self.settings.stream_linger_ms / 1000,
                                       revision=revision, engine_config_hash=runner.engine.engine_config_hash(),
                                       kv_overcommit=self.settings.kv_overcommit)
        except BaseException:
            close_all(handle.close for handle in opened)
            raise
        ending = worker.close if close is None else (lambda: (worker.silence(), close()))
        loop = Loop(f"worker-{pool or 'shared'}", lambda: worker.run_once(0.05),
                    lambda: close_all([ending, *(handle.close for handle in opened)])).start()
        loop.worker = worker
        return loop

    def _start_api(self) -> None:
        self.app = create_app(api_services(self.settings, self._log()))
        self.server, self._server_thread, self.port = serve_api(self.app, "api", lifespan="on")

    @contextmanager
    def api_replica(self, **settings):
        """Another API process over the same platform (its own log handle, stream hub and
        port, as a second replica would have), with `settings` changed, for the block;
        yields its base URL."""
        log = self.open_log()
        try:
            server, thread, port = serve_api(create_app(api_services(self.settings.model_copy(update=settings), log)),
                                             "api-replica", lifespan="on")
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                server.should_exit = True
                thread.join(15)
        finally:
            log.close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tenant(self, *, scopes: tuple[str, ...] = ("generate", "batch", "usage"), application: str = "default",
               **limits):
        """A new tenant and an API key for it, with `limits` if given: (tenant_id, secret)."""
        return new_tenant(self.view, scopes=scopes, application=application, **limits)

    def client(self, secret: str | None = None, timeout_s: float = 120.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def check(self) -> None:
        for loop in self.loops:
            if loop.error is not None:
                raise AssertionError(f"{loop.name} crashed: {loop.error!r}") from loop.error

    def close(self) -> None:
        """Stops the API and every loop, then closes every log handle, each even when one fails."""
        if self._server_thread is not None:
            self.server.should_exit = True
            self._server_thread.join(15)
        for loop in self.loops:
            loop.halt()
        close_all(log.close for log in self.logs)
