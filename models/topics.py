"""The topics of ledgerlm, their partition counts, retention, and what each carries.

Durable topics (no retention) carry no prompt or completion text, so they can be kept
and replayed forever; text lives only on the bounded-retention topics.
"""
from __future__ import annotations

from dataclasses import dataclass

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    partitions: int
    retention_ms: int | None
    keyed_by: str
    carries: str


REQUESTS = Topic("ledgerlm.requests", 8, None, "tenant", "GenerationRequested, CancelRequested")
LEDGER = Topic("ledgerlm.ledger", 8, None, "tenant",
               "BudgetReserved, GenerationAdmitted/Rejected, UsageSettled, Reservation*")
OUTCOMES = Topic("ledgerlm.outcomes", 8, None, "tenant", "GenerationStarted and terminal events, without text")
ADMIN = Topic("ledgerlm.admin", 1, None, "tenant", "tenants, keys, limits, model revisions and aliases")
PROMPTS = Topic("ledgerlm.prompts", 8, 7 * DAY_MS, "request", "PromptSubmitted (text)")
STREAM = Topic("ledgerlm.stream", 8, 1 * DAY_MS, "request", "GenerationStarted, TokensEmitted (text), terminal events")
WORK_HIGH = Topic("ledgerlm.work.interactive-high", 4, 1 * DAY_MS, "tenant", "GenerationQueued, priority high")
WORK_NORMAL = Topic("ledgerlm.work.interactive-normal", 4, 1 * DAY_MS, "tenant", "GenerationQueued, priority normal")
BATCHES = Topic("ledgerlm.batches", 8, None, "tenant", "files, batches, their chunks, budgets and outcomes (no text)")
# Not durable: heartbeats are many, and a fleet view is built from any recent suffix of it.
FLEET = Topic("ledgerlm.fleet", 4, 1 * DAY_MS, "worker", "WorkerJoined, WorkerHeartbeat, WorkerDraining, WorkerLeft")

DURABLE = (ADMIN, REQUESTS, LEDGER, OUTCOMES, BATCHES)
ALL = (ADMIN, REQUESTS, LEDGER, OUTCOMES, PROMPTS, STREAM, WORK_HIGH, WORK_NORMAL, BATCHES, FLEET)
WORK_BY_PRIORITY = {"high": WORK_HIGH, "normal": WORK_NORMAL}

SHARED_POOL = "interactive"


def work_topic(pool: str | None, priority: str) -> Topic:
    """Where admitted work of a pool and priority waits. The shared interactive pool uses
    WORK_HIGH/WORK_NORMAL; a dedicated pool (a tenant's `pool` limit) gets its own pair,
    so only workers started for it take that work. Anything but 'high' queues as normal."""
    if pool is None or pool == SHARED_POOL:
        return WORK_HIGH if priority == "high" else WORK_NORMAL
    level = "high" if priority == "high" else "normal"
    return Topic(f"ledgerlm.work.dedicated-{pool}-{level}", 4, 1 * DAY_MS, "tenant",
                 f"GenerationQueued for the dedicated pool {pool}, priority {level}")


def pool_work_topics(pool: str | None) -> tuple[Topic, Topic]:
    """A pool's work topics, high priority first."""
    return work_topic(pool, "high"), work_topic(pool, "normal")
