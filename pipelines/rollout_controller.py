"""Guardrails that act: follows the requests and outcomes topics, keeps each open rollout's
samples per arm (`pipelines.rollout_analysis`), and writes what a step's verdict calls for
as the same admin commands an operator would (`pipelines.rollouts`), as actor
`rollout-analysis`. Requests are counted in the step they were made in (from their
`GenerationRequested`, which names the rollout and arm); a generation counts when its
terminal is read.

Running two controllers is harmless: each command is written only while the rollout is
still at the step its verdict was reached on (`expected`), as the registry has it."""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import datetime, timedelta

from models import topics
from models.events import EventDecodeError, decode
from models.events_generation import GenerationRequested
from models.rollout import ARM_STABLE, RolloutState
from pipelines import rollouts
from pipelines.admin import AdminError, RegistryView
from pipelines.eventlog import EventLog
from pipelines.fleet import wall_clock
from pipelines.rollout_analysis import Sample, Verdict, judge, sample_of

logger = logging.getLogger(__name__)
ACTOR = "rollout-analysis"
LOOK_BACK = timedelta(minutes=10)  # read back on start: requests of a step begun before
MAX_PENDING = 100_000  # requests followed to their end at once; the oldest are dropped beyond
BASELINE = 500  # stable samples of earlier steps kept per rollout, for a step that sends stable none


class RolloutController:
    def __init__(self, log: EventLog, view: RegistryView, *, clock=wall_clock, every_s: float = 0.5):
        self._log, self._view, self._clock, self._every_s = log, view, clock, every_s
        since_ms = int((clock() - LOOK_BACK).timestamp() * 1000)
        self._tails = []
        for topic in (topics.REQUESTS, topics.OUTCOMES):
            tail = log.tail(topic.name, {p: 0 for p in range(log.partitions(topic.name))})
            tail.seek_to_time(since_ms)
            self._tails.append(tail)
        self._pending: dict[str, tuple[str, str, datetime]] = {}  # request -> (rollout, arm, requested at)
        self._samples: dict[str, list[tuple[datetime, Sample]]] = defaultdict(list)
        self._next_judgement = 0.0
        self.verdicts: list[tuple[str, Verdict]] = []  # what it acted on: (rollout id, verdict)

    def run_once(self, timeout_s: float = 0.1) -> None:
        registry = self._view.refresh()
        requests, outcomes = self._tails
        for record in requests.poll(max_records=2000, timeout_s=timeout_s):
            self._request(record.value, registry)
        for record in outcomes.poll(max_records=2000, timeout_s=0):
            self._terminal(record.value)
        if time.monotonic() >= self._next_judgement:
            self._next_judgement = time.monotonic() + self._every_s
            for rollout in list(registry.open_rollouts.values()):
                if not rollout.paused:
                    self._judge(rollout)

    def _request(self, value: bytes, registry) -> None:
        try:
            env = decode(value)
        except EventDecodeError:
            return
        p = env.payload
        if isinstance(p, GenerationRequested) and p.rollout_id in registry.rollouts and p.rollout_arm:
            if len(self._pending) >= MAX_PENDING:
                self._pending.pop(next(iter(self._pending)))
            self._pending[p.request_id] = (p.rollout_id, p.rollout_arm, env.occurred_at)

    def _terminal(self, value: bytes) -> None:
        try:
            env = decode(value)
        except EventDecodeError:
            return
        pending = self._pending.get(env.correlation_id)
        if pending is None:
            return
        rollout_id, arm, requested_at = pending
        sample = sample_of(arm, env.payload)
        if sample is not None or env.event_type in ("GenerationCancelled",):
            del self._pending[env.correlation_id]
        if sample is not None:
            self._samples[rollout_id].append((requested_at, sample))

    def _judge(self, rollout: RolloutState) -> None:
        kept = self._samples.get(rollout.rollout_id, [])
        since = rollout.stepped_at or rollout.started_at
        step = [s for at, s in kept if at >= since]
        baseline = [s for at, s in kept if at < since and s.arm == ARM_STABLE][-BASELINE:]
        self._samples[rollout.rollout_id] = [(at, s) for at, s in kept if at >= since] + \
            [(since - timedelta(microseconds=1), s) for s in baseline]
        verdict = judge(rollout, step, self._clock(), baseline)
        if verdict.action == "wait":
            return
        alias, expected = rollout.alias, (rollout.rollout_id, rollout.step)
        try:
            if verdict.action == "rollback":
                rollouts.rollback(self._view, alias=alias, actor=ACTOR, reason="guardrail", figure=verdict.figure,
                                  value=verdict.value, threshold=verdict.threshold, expected=expected)
            elif verdict.action == "pause":
                rollouts.pause(self._view, alias=alias, actor=ACTOR, reason="inconclusive", detail=verdict.detail,
                               expected=expected)
            elif verdict.action == "step":
                rollouts.step(self._view, alias=alias, actor=ACTOR, reason="analysis", expected=expected)
            elif verdict.action == "promote":
                rollouts.promote(self._view, alias=alias, actor=ACTOR, expected=expected)
        except AdminError as exc:  # the rollout moved meanwhile (an operator, another controller)
            logger.info("rollout %s: %s not written (%s)", rollout.rollout_id, verdict.action, exc)
            return
        self.verdicts.append((rollout.rollout_id, verdict))
        logger.warning("rollout %s of %s: %s%s", rollout.rollout_id, alias, verdict.action,
                       f" ({verdict.detail})" if verdict.detail else "")

    def close(self) -> None:
        for tail in self._tails:
            tail.close()
