"""Guardrails that act: follows the requests and outcomes topics, keeps each open rollout's
samples per arm (`pipelines.rollouts.analysis`), and writes what a step's verdict calls for
as the same admin commands an operator would (`pipelines.rollouts.commands`), as actor
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
from models.events import new_event
from models.events_generation import (
    GenerationCancelled, GenerationCompleted, GenerationFailed, GenerationRequested, TokensEmitted,
)
from models.events_rollout import ShadowCompared
from models.rollout import ARM_STABLE, SHADOW_TENANT, RolloutState
from pipelines.rollouts import evals
from pipelines.rollouts import commands as rollouts
from pipelines.admin.commands import AdminError, RegistryView
from pipelines.eventlog import EventLog, partition_for
from pipelines.fleet import wall_clock
from pipelines.rollouts.analysis import Sample, Verdict, judge, sample_of
from pipelines.publish import publish

logger = logging.getLogger(__name__)
ACTOR = "rollout-analysis"
LOOK_BACK = timedelta(minutes=10)  # read back on start: requests of a step begun before
# Requests followed to their end at once; the oldest are dropped beyond (a request refused
# at admission, a dropped shadow copy among them, ends on the ledger, which this does not read).
MAX_PENDING = 100_000
BASELINE = 500  # stable samples of earlier steps kept per rollout, for a step that sends stable none
MAX_STREAM_PAGES = 40  # pages of 500 stream records read at most for one shadow pair's text
TERMINAL_TYPES = frozenset({t.event_type for t in (GenerationCompleted, GenerationFailed, GenerationCancelled)})


class RolloutController:
    def __init__(self, log: EventLog, view: RegistryView, *, clock=wall_clock, every_s: float = 0.5,
                 embedder=None):
        """`embedder`: compares a shadow copy's text with stable's (`pipelines.cache.similarity`);
        None records the pairs' lengths and latencies without a similarity."""
        self._log, self._view, self._clock, self._every_s = log, view, clock, every_s
        self._embedder = embedder
        since_ms = int((clock() - LOOK_BACK).timestamp() * 1000)
        self._tails = []
        for topic in (topics.REQUESTS, topics.OUTCOMES):
            tail = log.tail(topic.name, {p: 0 for p in range(log.partitions(topic.name))})
            tail.seek_to_time(since_ms)
            self._tails.append(tail)
        self._pending: dict[str, tuple[str, str, datetime]] = {}  # request -> (rollout, arm, requested at)
        self._samples: dict[str, list[tuple[datetime, Sample]]] = defaultdict(list)
        # Shadow pairs: each request's stream start, the copy of each client request, the
        # ends read so far; the similarities of compared pairs per rollout.
        self._streams: dict[str, tuple[int, int]] = {}
        self._copy_of: dict[str, str] = {}  # client request -> its shadow copy
        self._primary_of: dict[str, str] = {}  # shadow copy -> its client request
        self._ends: dict[str, object] = {}
        self._similarities: dict[str, list[tuple[datetime, float]]] = defaultdict(list)
        self.compared: list[ShadowCompared] = []
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
                    self._judge(rollout, registry)

    def _request(self, value: bytes, registry) -> None:
        try:
            env = decode(value)
        except EventDecodeError:
            return
        p = env.payload
        if isinstance(p, GenerationRequested) and p.rollout_id in registry.rollouts and p.rollout_arm:
            if len(self._pending) >= MAX_PENDING:
                dropped = next(iter(self._pending))
                self._pending.pop(dropped)
                self._forget(dropped)
            self._pending[p.request_id] = (p.rollout_id, p.rollout_arm, env.occurred_at)
            if registry.rollouts[p.rollout_id].mode == "shadow":
                self._streams[p.request_id] = (partition_for(p.request_id, self._stream_partitions()), p.stream_offset)
                if p.shadow_of is not None:
                    self._copy_of[p.shadow_of] = p.request_id
                    self._primary_of[p.request_id] = p.shadow_of

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
        if env.correlation_id in self._streams and env.event_type in TERMINAL_TYPES:
            self._ends[env.correlation_id] = env.payload
            self._pair(env.correlation_id, rollout_id, requested_at)

    def _stream_partitions(self) -> int:
        if not hasattr(self, "_stream_count"):
            self._stream_count = self._log.partitions(topics.STREAM.name)
        return self._stream_count

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._ends.pop(request_id, None)
        self._primary_of.pop(self._copy_of.pop(request_id, ""), None)
        self._copy_of.pop(self._primary_of.pop(request_id, ""), None)

    def _pair(self, request_id: str, rollout_id: str, requested_at: datetime) -> None:
        """Once both ends of a shadow pair are read: compares them, records `ShadowCompared`."""
        primary = self._primary_of.get(request_id, request_id)
        copy = self._copy_of.get(primary)
        if copy is None or primary not in self._ends or copy not in self._ends:
            return
        stable, candidate = self._ends[primary], self._ends[copy]
        where = {r: self._streams.get(r) for r in (primary, copy)}
        for done in (primary, copy):
            self._forget(done)
        if not (isinstance(stable, GenerationCompleted) and isinstance(candidate, GenerationCompleted)):
            return  # a failed copy counts as the candidate's failure; nothing to compare
        similarity = None
        if self._embedder is not None:
            texts = [self._text(r, *where[r]) for r in (primary, copy) if where[r] is not None]
            if len(texts) == 2 and None not in texts:
                similarity = round(self._embedder.similarity(*texts), 4)
        st, ct = stable.timings, candidate.timings
        compared = ShadowCompared(
            rollout_id=rollout_id, request_id=primary, shadow_request_id=copy, similarity=similarity,
            stable_output_tokens=stable.output_tokens, candidate_output_tokens=candidate.output_tokens,
            ttft_delta_ms=None if st.ttft_ms is None or ct.ttft_ms is None else ct.ttft_ms - st.ttft_ms,
            duration_delta_ms=ct.duration_ms - st.duration_ms)
        publish(self._log, topics.OUTCOMES, [new_event(compared, tenant_id=SHADOW_TENANT, correlation_id=copy)])
        self.compared.append(compared)
        if similarity is not None:
            self._similarities[rollout_id].append((requested_at, similarity))

    def _text(self, request_id: str, partition: int, offset: int) -> str | None:
        """The request's output, read from its stream partition from where its stream began
        up to its end; None when that is not all on the log yet, or too far to read."""
        parts, position = [], offset
        for _ in range(MAX_STREAM_PAGES):
            records = self._log.read(topics.STREAM.name, partition, position, max_records=500, timeout_s=0)
            if not records:
                return None
            for record in records:
                position = record.offset + 1
                try:
                    env = decode(record.value)
                except EventDecodeError:
                    continue
                if env.correlation_id != request_id:
                    continue
                if isinstance(env.payload, TokensEmitted):
                    parts.append(env.payload.text)
                elif env.event_type in TERMINAL_TYPES:
                    return "".join(parts)
        return None

    def _judge(self, rollout: RolloutState, registry) -> None:
        kept = self._samples.get(rollout.rollout_id, [])
        since = rollout.stepped_at or rollout.started_at
        step = [s for at, s in kept if at >= since]
        baseline = [s for at, s in kept if at < since and s.arm == ARM_STABLE][-BASELINE:]
        self._samples[rollout.rollout_id] = [(at, s) for at, s in kept if at >= since] + \
            [(since - timedelta(microseconds=1), s) for s in baseline]
        similar = self._similarities.get(rollout.rollout_id, [])
        self._similarities[rollout.rollout_id] = [(at, x) for at, x in similar if at >= since]
        verdict = judge(rollout, step, self._clock(), baseline, [x for at, x in similar if at >= since],
                        evals.compared(registry, rollout.stable_revision, rollout.candidate_revision))
        if verdict.action == "wait":
            return
        alias, expected = rollout.alias, (rollout.rollout_id, rollout.step, rollout.candidate_revision)
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
