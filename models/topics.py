"""The topics of ledgerlm, their partition counts, retention, and what each carries.

Durable topics (no retention) carry no prompt or completion text, so they can be kept
and replayed forever; text lives only on the bounded-retention topics.

A revision's work topics are keyed by request and have `WORK_PARTITIONS` (32) partitions
each, so one tenant's work spreads over every worker of its pool and revision, and a failed
worker's partitions spread over all survivors. A consumer group gives each member at least
one partition of a topic only up to its partition count: the largest pool the design
serves is 32 workers per pool and revision (a 33rd would own no partition of a topic and
sit idle). The revision-less topics (`WORK_HIGH`/`WORK_NORMAL`, a dedicated pool's pair
without a revision) stay keyed by tenant with 4 partitions: admission pins every request
to a revision, so only workers started without one read them.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    partitions: int
    retention_ms: int | None
    keyed_by: str
    carries: str


REQUESTS = Topic("ledgerlm.requests", 8, None, "tenant", "GenerationRequested, CancelRequested, OutputDelivered")
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
# The most workers one pool and revision can use: each needs a partition of both topics.
WORK_PARTITIONS = 32


def revision_slug(revision: str) -> str:
    """A revision as a topic-name part: the characters Kafka allows, and a short digest of
    the revision itself so two revisions never share a name ('a@b' and 'a-b')."""
    digest = hashlib.sha256(revision.encode()).hexdigest()[:8]
    readable = re.sub(r"[^A-Za-z0-9._-]", "-", revision)[:80]
    return f"{readable}-{digest}"


def work_topic(pool: str | None, priority: str, revision: str | None = None) -> Topic:
    """Where admitted work of a pool, priority and model revision waits. Work pinned to a
    revision waits on that revision's own topics, which only workers serving it read, so no
    request runs on a model it was not pinned to. The shared interactive pool without a
    revision uses WORK_HIGH/WORK_NORMAL; a dedicated pool (a tenant's `pool` limit) gets its
    own pair. Anything but 'high' queues as normal."""
    level = "high" if priority == "high" else "normal"
    shared = pool is None or pool == SHARED_POOL
    if revision is None:
        if shared:
            return WORK_HIGH if level == "high" else WORK_NORMAL
        return Topic(f"ledgerlm.work.dedicated-{pool}-{level}", 4, 1 * DAY_MS, "tenant",
                     f"GenerationQueued for the dedicated pool {pool}, priority {level}")
    lane = f"interactive-{level}" if shared else f"dedicated-{pool}-{level}"
    # Keyed by request: a tenant's work is not tied to one worker. The worker's marks of an
    # item go to the item's own partition (workers.interactive), whatever the key says.
    return Topic(f"ledgerlm.work.{lane}.{revision_slug(revision)}", WORK_PARTITIONS, 1 * DAY_MS, "request",
                 f"GenerationQueued for pool {pool or SHARED_POOL}, priority {level}, revision {revision}")


# Admission's consumer group; a worker that admits (`serve worker --admit`) is a member of
# it under `admission_member` of its own id.
ADMISSION_GROUP = "ledgerlm-admission"


def admission_member(worker_id: str) -> str:
    return f"{worker_id}-admission"


def work_group(pool: str, revision: str | None = None) -> str:
    """The consumer group of the workers taking a pool's work for one revision."""
    return f"ledgerlm-pool-{pool}" + (f"-{revision_slug(revision)}" if revision else "")


def pool_work_topics(pool: str | None, revision: str | None = None) -> tuple[Topic, Topic]:
    """A pool's work topics for one revision (or the unrevisioned ones), high priority first."""
    return work_topic(pool, "high", revision), work_topic(pool, "normal", revision)
