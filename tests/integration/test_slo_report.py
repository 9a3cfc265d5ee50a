"""The SLO report read from projected generations, on PostgreSQL and SQLite: figures equal
to what the log's own events say, the window's bounds and a revision filter respected, and
a replay of the log into an empty database giving the same report."""
from __future__ import annotations

import math
import random
from collections import defaultdict
from datetime import datetime, timedelta, timezone

from models import topics
from models.events import new_event
from models.events_generation import (
    BudgetReserved, CancelRequested, GenerationAdmitted, GenerationCancelled, GenerationCompleted, GenerationFailed,
    GenerationRejected, GenerationRequested, GenerationStarted, Position, ReservationExpired, Timings, UsageSettled,
)
from models.prompt_class import PromptThresholds
from pipelines.audit.digest import table_digests
from pipelines.audit.replay import replay
from pipelines.projections.slo import slo_report
from pipelines.projections.sql import open_projection_db
from tests.integration.conftest_ledger import EVERY, SIGNER, project
from tests.ledger_workload import append_all

T0 = datetime(2025, 7, 1, 12, 0, tzinfo=timezone.utc)
WINDOW = timedelta(minutes=10)
THRESHOLDS = PromptThresholds(short_max_tokens=128, long_min_tokens=1024)
REVISIONS = ("tiny@r1", "tiny@r2")
LENGTHS = {"short": (5, 128), "medium": (129, 1023), "long": (1024, 4000)}


def nearest_rank_p95(values: list[float]) -> float | None:
    return sorted(values)[math.ceil(0.95 * len(values)) - 1] if values else None


class SloLedger:
    """Generations as the platform writes their events, and what each should count for."""

    def __init__(self, seed: int):
        self.rng, self.events, self.n = random.Random(seed), [], 0
        self.ttft: dict[tuple, list[float]] = defaultdict(list)
        self.tpot: dict[tuple, list[float]] = defaultdict(list)
        self.ends: dict[tuple, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.rejections: dict[str, int] = defaultdict(int)

    def generation(self, at: datetime, revision: str, cls: str, end: str, counted: bool = True) -> None:
        self.n += 1
        rid, tenant = f"gen_{self.n:05d}", f"tenant-{self.n % 3}"
        ev = lambda p, ms=0: new_event(p, tenant_id=tenant, correlation_id=rid,  # noqa: E731
                                       occurred_at=at + timedelta(milliseconds=ms))
        prompt = self.rng.randint(*LENGTHS[cls])
        out = [(topics.REQUESTS, ev(GenerationRequested(
            request_id=rid, model_alias="tiny", model_revision=revision, input_tokens=prompt, input_sha256="ab" * 32,
            max_output_tokens=64, prompt_ref=Position(topic=topics.PROMPTS.name, partition=0, offset=self.n))))]
        if end.startswith("rejected:"):
            out.append((topics.LEDGER, ev(GenerationRejected(request_id=rid, reason=end[9:], message="no"), 1)))
            self.rejections[end[9:]] += counted
            self.events += out
            return
        res = f"res_{self.n:05d}"
        out += [(topics.LEDGER, ev(BudgetReserved(request_id=rid, reservation_id=res, tokens=prompt + 64,
                                                  cost_micros=10, expires_at=at + timedelta(minutes=5)), 1)),
                (topics.LEDGER, ev(GenerationAdmitted(request_id=rid, reservation_id=res,
                                                      work_topic=topics.WORK_NORMAL.name), 1))]
        queued, ttft, output = self.rng.randint(0, 40), self.rng.randint(5, 900), self.rng.randint(1, 60)
        duration = ttft + (output - 1) * self.rng.randint(2, 30)
        timings = Timings(queued_ms=queued, ttft_ms=ttft, duration_ms=duration)
        started = (topics.OUTCOMES, ev(GenerationStarted(request_id=rid, worker_id="w1", model_revision=revision,
                                                         queued_ms=queued), 2))
        used_input, status = prompt, end
        if end == "completed":
            out += [started, (topics.OUTCOMES, ev(GenerationCompleted(
                request_id=rid, finish_reason="stop", input_tokens=prompt, output_tokens=output,
                model_revision=revision, output_sha256="cd" * 32, timings=timings), 3))]
            if counted:
                self.ttft[(revision, cls)].append(queued + ttft)
                if output > 1:
                    self.tpot[(revision, cls)].append((duration - ttft) / (output - 1))
        elif end == "failed":
            out += [started, (topics.OUTCOMES, ev(GenerationFailed(request_id=rid, error_code="engine_error",
                                                                   message="died", input_tokens=prompt,
                                                                   output_tokens=output, timings=timings), 3))]
        elif end == "client":
            status = "cancelled"
            out += [started, (topics.REQUESTS, ev(CancelRequested(request_id=rid, reason="client"), 3)),
                    (topics.OUTCOMES, ev(GenerationCancelled(request_id=rid, reason="client", input_tokens=prompt,
                                                             output_tokens=output, timings=timings), 4))]
        elif end == "expired":  # never ran: nothing charged, its prompt length still known
            used_input, output = 0, 0
            out += [(topics.LEDGER, ev(ReservationExpired(request_id=rid, reservation_id=res), 5)),
                    (topics.OUTCOMES, ev(GenerationFailed(request_id=rid, error_code="expired", message="late"), 5))]
        elif end == "running":
            out.append(started)
        if end != "running":
            out.append((topics.LEDGER, ev(UsageSettled(request_id=rid, reservation_id=res, terminal_status=status,
                                                       input_tokens=used_input, output_tokens=output,
                                                       cost_micros=1), 6)))
        if counted:
            self.ends[(revision, cls)][end] += 1
        self.events += out


def build(seed: int = 3) -> SloLedger:
    ledger = SloLedger(seed)
    ends = ["completed"] * 8 + ["failed", "client", "expired", "running", "rejected:shed", "rejected:rate"]
    for i in range(150):
        ledger.generation(T0 + timedelta(seconds=3 * i), ledger.rng.choice(REVISIONS), ledger.rng.choice(list(LENGTHS)),
                          ledger.rng.choice(ends))
    # Just outside the window on either side: counted nowhere.
    ledger.generation(T0 - timedelta(milliseconds=1), "tiny@r1", "short", "failed", counted=False)
    ledger.generation(T0 + WINDOW, "tiny@r1", "short", "rejected:shed", counted=False)
    return ledger


def check(report, ledger: SloLedger, revisions=REVISIONS) -> None:
    latency = {(x.model_revision, x.prompt_class): x for x in report.latency}
    assert set(latency) == {k for k in ledger.ttft if k[0] in revisions}
    for key, row in latency.items():
        assert row.generations == len(ledger.ttft[key])
        assert row.ttft_p95_ms == nearest_rank_p95(ledger.ttft[key]), key
        assert row.tpot_p95_ms == nearest_rank_p95(ledger.tpot[key]), key
    for a in report.availability:
        ends = ledger.ends[(a.model_revision, a.prompt_class)]
        assert (a.completed, a.failed, a.expired, a.cancelled_by_client, a.in_flight) == (
            ends["completed"], ends["failed"], ends["expired"], ends["client"], ends["running"])
        judged = ends["completed"] + ends["failed"] + ends["expired"]
        assert a.availability == ends["completed"] / judged
    assert {(a.model_revision, a.prompt_class) for a in report.availability} == {
        k for k in ledger.ends if k[0] in revisions}


def test_the_report_says_what_the_logged_generations_did_and_a_replay_says_it_again(embedded_ledger_log, ledger_dbs):
    log = embedded_ledger_log()
    ledger = build()
    append_all(log, ledger.events)
    live_url = ledger_dbs.new()
    project(log, live_url, batch_events=37)  # small batches: the three topics read at different paces
    live = open_projection_db(live_url)
    try:
        report = slo_report(live, since=T0, until=T0 + WINDOW, thresholds=THRESHOLDS)
        check(report, ledger)
        assert {r: c["all"] for r, c in report.rejections_by_reason().items()} == dict(ledger.rejections)
        total = report.total
        assert total.admitted == sum(n for v in ledger.ends.values() for n in v.values())
        assert 0 < total.availability < 1 and total.in_flight > 0 and total.cancelled_by_client > 0

        only = slo_report(live, since=T0, until=T0 + WINDOW, thresholds=THRESHOLDS, revision="tiny@r2")
        check(only, ledger, revisions=("tiny@r2",))
        assert {a.model_revision for a in only.by_revision} == {"tiny@r2"}

        replayed_url = ledger_dbs.new(migrate=False)
        result = replay(log, replayed_url, SIGNER, batch_events=5000, checkpoint_every=EVERY)
        assert {d.table: d.sha256 for d in result.digests} == {d.table: d.sha256 for d in table_digests(live)}
        rebuilt = open_projection_db(replayed_url)
        try:
            again = slo_report(rebuilt, since=T0, until=T0 + WINDOW, thresholds=THRESHOLDS)
            assert again.as_dict() == report.as_dict()
        finally:
            rebuilt.dispose()
    finally:
        live.dispose()
        log.close()
