"""What the platform's processes (`api.cli.processes`) are started with and hand back to the run
loop: `Launch` (the settings, the flags, the event that stops the process, the stack what it
opens closes on) and `Started` (what runs, what is served beside it, what it says once it
serves). `Refused`: a process that will not start, with what it says and its exit status.
Also the admission processor as the settings configure it, which two processes run
(`serve admission`, and `serve worker --admit` beside the worker)."""
from __future__ import annotations

import argparse
import threading
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable

from models.settings import Settings


class Refused(Exception):
    """A process that will not start: its message (said on stderr as it is) and exit status."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


@dataclass
class Launch:
    """What a process starts with. What it opens goes on `held`, closed when it ends, the
    last opened first. `open_log` opens a handle on the event log (None: the one the
    settings name, through `pipelines.bootstrap`); a test hands in its own."""

    settings: Settings
    args: argparse.Namespace
    stop: threading.Event
    held: ExitStack
    open_log: Callable[[], Any] | None = None

    def log(self, *, create_topics: bool = True):
        """A new log handle, closed with the process."""
        if self.open_log is not None:
            log = self.open_log()
        else:
            from pipelines.bootstrap import Bootstrap

            log = Bootstrap(self.settings).event_log(create_topics=create_topics)
        self.held.callback(log.close)
        return log

    def hold(self, thing, close: Callable[[], object] | None = None):
        """`thing`, closed with the process (by `close`, or its own `close()`)."""
        self.held.callback(close or thing.close)
        return thing


@dataclass
class Started:
    """A started process, as its run loop takes it: `main` (the component that runs),
    `run(stop)` (returns once `stop` is set), the readiness of its components and the
    metrics served beside them, `/readyz`'s checks, the ready line it prints once it serves
    (given its metrics port, None when it serves none), and its exit status once closed."""

    main: object
    run: Callable[[threading.Event], object]
    readiness: tuple = ()
    registries: tuple = ()
    ready: Callable[[], dict[str, bool]] | None = None
    ready_line: Callable[[int | None], dict] | None = None
    exit_code: Callable[[], int] = lambda: 0
    parts: dict[str, object] = field(default_factory=dict)  # other components it runs, by name


def admission_processor(settings: Settings, log, *, taker=None, member_id: str | None = None, on_written=None):
    """An `AdmissionProcessor` on `log` as the settings configure it."""
    from datetime import timedelta

    from pipelines.admission.capacity import QueueBound
    from pipelines.admission.processor import AdmissionProcessor
    from pipelines.bootstrap import Bootstrap

    platform = Bootstrap(settings)
    return AdmissionProcessor(log, platform.registry_view(log), grace=timedelta(seconds=settings.grace_s), taker=taker,
                              member_id=member_id, on_written=on_written, lost_after_s=settings.worker_lost_after_s,
                              queue_bound=QueueBound.from_settings(settings), floors=platform.service_floors(),
                              affinity_slack=settings.work_affinity_slack)
