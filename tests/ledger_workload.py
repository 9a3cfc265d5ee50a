"""A realistic mix of durable events, made with the real event classes, for the
projection and audit tests and the replay benchmark.

Deterministic for a seed: ids and times come from the seed, so two runs append the same
bytes. Per generation it writes what the platform writes: the request, the reservation
and admission (or a rejection), the start and terminal event, the settlement and the
release; some fail, some are cancelled, some expire; admin events come now and then.
"""
from __future__ import annotations

import random
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from models import topics
from models.events import Envelope, encode, new_event, registered_types
from models.events_admin import ApiKeyIssued, ApiKeyRevoked, ModelAliasSet, ModelRevisionApproved, TenantCreated
from models.events_batch import (
    BatchChunkCompleted, BatchChunkQueued, BatchChunkStarted, BatchCompleted, BatchFinalizationStarted,
    BatchSubmitted, BatchUsageSettled, BatchValidated, ChunkPlan, RequestCounts,
)
from models.events_generation import (
    BudgetReserved, CancelRequested, GenerationAdmitted, GenerationCancelled, GenerationCompleted, GenerationFailed,
    GenerationRejected, GenerationRequested, GenerationStarted, Position, ReservationExpired, ReservationReleased,
    Timings, UsageSettled,
)
from pipelines.eventlog import EventLog, Message

BASE = datetime(2025, 3, 1, tzinfo=timezone.utc)
MODELS = {"tiny": ("tiny@rev1", 100, 300), "small": ("small@rev7", 400, 1200)}  # revision, price in/out per 1k


@dataclass
class Expected:
    """What the workload should project to: settled totals per tenant, and counts."""

    settled: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    statuses: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    events: int = 0


class Workload:
    def __init__(self, seed: int = 7, tenants: int = 6, span: timedelta = timedelta(days=3)):
        self.rng = random.Random(seed)
        self.tenants = [f"tenant-{i:02d}" for i in range(tenants)]
        self.span = span
        self.expected = Expected()
        self._n = 0

    def _id(self) -> uuid.UUID:
        return uuid.UUID(int=self.rng.getrandbits(128), version=4)

    def _ev(self, payload, tenant: str, correlation: str, at: datetime) -> Envelope:
        return new_event(payload, tenant_id=tenant, correlation_id=correlation, occurred_at=at, event_id=self._id())

    def admin(self, at: datetime = BASE) -> list[tuple]:
        out = []
        for alias, (revision, price_in, price_out) in MODELS.items():
            out.append((topics.ADMIN, self._ev(ModelRevisionApproved(
                model_revision=revision, model_path=f"/models/{alias}", engine_config_hash="cfg" + alias,
                max_model_len=4096, price_input_per_1k_micros=price_in, price_output_per_1k_micros=price_out,
                actor="ops"), "_platform", "admin-" + alias, at)))
            out.append((topics.ADMIN, self._ev(ModelAliasSet(alias=alias, model_revision=revision, actor="ops"),
                                               "_platform", "admin-" + alias, at)))
        for tenant in self.tenants:
            out.append((topics.ADMIN, self._ev(TenantCreated(tenant_id=tenant, name=tenant.title(), actor="ops"),
                                               tenant, "admin-" + tenant, at)))
            for app in ("chat", "search"):
                key_id = f"key_{tenant[-2:]}{app[:2]}"
                out.append((topics.ADMIN, self._ev(ApiKeyIssued(
                    key_id=key_id, tenant_id=tenant, application_id=app, secret_sha256="0" * 64,
                    scopes=("generate", "usage"), actor="ops"), tenant, "admin-" + key_id, at)))
        limits = registered_types().get("TenantLimitsChanged")
        if limits is not None:
            for tenant in self.tenants[:2]:
                out.append((topics.ADMIN, self._ev(limits(tenant_id=tenant, tokens_per_window=1_000_000,
                                                          window_seconds=3600, actor="ops"), tenant, "limits", at)))
        self.expected.events += len(out)
        return out

    def generation(self, at: datetime) -> list[tuple]:
        rng = self.rng
        self._n += 1
        tenant = rng.choice(self.tenants)
        alias = rng.choice(list(MODELS))
        revision, price_in, price_out = MODELS[alias]
        app = rng.choice(("chat", "search"))
        rid = f"gen_{self._n:08d}"
        ev = lambda payload, dt_ms=0: self._ev(payload, tenant, rid, at + timedelta(milliseconds=dt_ms))  # noqa: E731
        input_tokens, max_out = rng.randint(5, 2000), rng.choice((64, 256, 512))
        out = [(topics.REQUESTS, ev(GenerationRequested(
            request_id=rid, application_id=app, key_id=f"key_{tenant[-2:]}{app[:2]}", model_alias=alias,
            model_revision=revision, input_tokens=input_tokens, input_sha256="ab" * 32, max_output_tokens=max_out,
            deadline_at=at + timedelta(minutes=2), prompt_ref=Position(topic=topics.PROMPTS.name, partition=0,
                                                                       offset=self._n))))]
        roll = rng.random()
        if roll < 0.05:
            out.append((topics.LEDGER, ev(GenerationRejected(request_id=rid, reason="tokens", message="over budget",
                                                             retry_after_ms=1000), 2)))
            return self._done(out, tenant, "rejected", 0, 0, 0)
        reservation = f"res_{self._n:08d}"
        reserved_cost = (input_tokens * price_in + max_out * price_out + 999) // 1000
        out += [(topics.LEDGER, ev(BudgetReserved(request_id=rid, reservation_id=reservation,
                                                  tokens=input_tokens + max_out, cost_micros=reserved_cost,
                                                  expires_at=at + timedelta(minutes=3), model_revision=revision), 2)),
                (topics.LEDGER, ev(GenerationAdmitted(request_id=rid, reservation_id=reservation,
                                                      work_topic=topics.WORK_NORMAL.name), 2))]
        queued = rng.randint(1, 50)
        timings = Timings(queued_ms=queued, ttft_ms=queued + rng.randint(5, 80), duration_ms=rng.randint(100, 4000))
        output = rng.randint(1, max_out)
        if roll < 0.08:
            status, output = "expired", 0
            cause = ev(ReservationExpired(request_id=rid, reservation_id=reservation), 180_000)
            out += [(topics.LEDGER, cause),
                    (topics.OUTCOMES, ev(GenerationFailed(request_id=rid, error_code="expired",
                                                          message="no result before the deadline"), 180_000))]
            input_used = 0
        else:
            input_used = input_tokens
            out.append((topics.OUTCOMES, ev(GenerationStarted(request_id=rid, worker_id="w1", model_revision=revision,
                                                              queued_ms=queued), queued)))
            if roll < 0.12:
                status = "failed"
                out.append((topics.OUTCOMES, ev(GenerationFailed(request_id=rid, error_code="engine_error",
                                                                 message="engine died", input_tokens=input_tokens,
                                                                 output_tokens=output, timings=timings), 900)))
            elif roll < 0.17:
                status = "cancelled"
                out.append((topics.REQUESTS, ev(CancelRequested(request_id=rid, reason="client"), 500)))
                out.append((topics.OUTCOMES, ev(GenerationCancelled(request_id=rid, reason="client",
                                                                    input_tokens=input_tokens, output_tokens=output,
                                                                    timings=timings), 600)))
            else:
                status = "completed"
                out.append((topics.OUTCOMES, ev(GenerationCompleted(
                    request_id=rid, finish_reason=rng.choice(("stop", "length")), input_tokens=input_tokens,
                    output_tokens=output, model_revision=revision, output_sha256="cd" * 32, timings=timings), 1000)))
        used = min(input_tokens + max_out, input_used + output)
        cost = min(reserved_cost, (input_used * price_in + 999) // 1000 + (output * price_out + 999) // 1000)
        out += [(topics.LEDGER, ev(UsageSettled(request_id=rid, reservation_id=reservation, terminal_status=status,
                                                input_tokens=input_used, output_tokens=output, cost_micros=cost),
                                   181_000 if status == "expired" else 1001)),
                (topics.LEDGER, ev(ReservationReleased(request_id=rid, reservation_id=reservation,
                                                       released_tokens=input_tokens + max_out - used,
                                                       released_cost_micros=reserved_cost - cost), 1001))]
        return self._done(out, tenant, status, input_used, output, cost)

    def batch(self, at: datetime, chunks: int = 3) -> list[tuple]:
        """One batch job of `chunks` chunks, each settled; usage goes to the expected totals."""
        rng = self.rng
        self._n += 1
        tenant, batch_id = rng.choice(self.tenants), f"batch_{self._n:08d}"
        revision, price_in, price_out = MODELS["tiny"]
        ev = lambda payload, dt_ms=0: self._ev(payload, tenant, batch_id, at + timedelta(milliseconds=dt_ms))  # noqa: E731
        plans = tuple(ChunkPlan(chunk_index=i, requests=10, tokens=5000, cost_micros=2000) for i in range(chunks))
        out = [(topics.BATCHES, ev(BatchSubmitted(batch_id=batch_id, endpoint="/v1/chat/completions",
                                                  input_key=f"in/{batch_id}", expires_at=at + timedelta(hours=24),
                                                  application_id="batch", key_id=f"key_{tenant[-2:]}ch"))),
               (topics.BATCHES, ev(BatchValidated(batch_id=batch_id, model_alias="tiny", model_revision=revision,
                                                  total_requests=10 * chunks, invalid_requests=0, chunks=plans), 5))]
        totals = self.expected.settled[tenant]
        used_in = used_out = 0
        for i in range(chunks):
            tokens_in, tokens_out = rng.randint(500, 3000), rng.randint(100, 1500)
            cost = (tokens_in * price_in + 999) // 1000 + (tokens_out * price_out + 999) // 1000
            out += [(topics.BATCHES, ev(BatchChunkQueued(batch_id=batch_id, chunk_index=i, reservation_id=f"r{i}",
                                                         tokens=5000, cost_micros=2000), 10 + i)),
                    (topics.BATCHES, ev(BatchChunkStarted(batch_id=batch_id, chunk_index=i, worker_id="b1",
                                                          attempt=1), 20 + i)),
                    (topics.BATCHES, ev(BatchChunkCompleted(
                        batch_id=batch_id, chunk_index=i, part_key=f"out/{batch_id}/{i}", completed=10, failed=0,
                        input_tokens=tokens_in, output_tokens=tokens_out, model_revision=revision, worker_id="b1",
                        duration_ms=rng.randint(1000, 9000)), 1000 + i)),
                    (topics.BATCHES, ev(BatchUsageSettled(
                        batch_id=batch_id, chunk_index=i, reservation_id=f"r{i}", input_tokens=tokens_in,
                        output_tokens=tokens_out, cost_micros=cost, released_tokens=0, released_cost_micros=0),
                        1001 + i))]
            totals["batch_chunks"] += 1
            totals["input_tokens"] += tokens_in
            totals["output_tokens"] += tokens_out
            totals["cost_micros"] += cost
            used_in, used_out = used_in + tokens_in, used_out + tokens_out
        out += [(topics.BATCHES, ev(BatchFinalizationStarted(batch_id=batch_id), 5000)),
                (topics.BATCHES, ev(BatchCompleted(batch_id=batch_id, request_counts=RequestCounts(
                    total=10 * chunks, completed=10 * chunks), input_tokens=used_in, output_tokens=used_out), 6000))]
        self.expected.statuses["batch_completed"] += 1
        self.expected.events += len(out)
        return out

    def _done(self, out, tenant, status, input_tokens, output_tokens, cost) -> list[tuple]:
        e = self.expected
        e.statuses[status] += 1
        e.events += len(out)
        if status != "rejected":
            totals = e.settled[tenant]
            totals["requests"] += 1
            totals["input_tokens"] += input_tokens
            totals["output_tokens"] += output_tokens
            totals["cost_micros"] += cost
        return out

    def generations(self, count: int, start: int = 0, total: int | None = None) -> list[tuple]:
        """`count` generations spread over the span; `start`/`total` place this slice in a longer run."""
        total = total or count
        step = self.span / max(total, 1)
        out = []
        for i in range(start, start + count):
            out += self.generation(BASE + step * i)
            if i % 500 == 499:
                out += self.key_revocation(BASE + step * i)
            if i % 100 == 50:
                out += self.batch(BASE + step * i)
        return out

    def key_revocation(self, at: datetime) -> list[tuple]:
        tenant = self.rng.choice(self.tenants)
        self.expected.events += 1
        return [(topics.ADMIN, self._ev(ApiKeyRevoked(key_id=f"key_{tenant[-2:]}se", tenant_id=tenant, actor="ops"),
                                        tenant, "revoke", at))]


def append_all(log: EventLog, events: list[tuple], chunk: int = 5000) -> int:
    """Appends in event order per topic (so each partition keeps the platform's order)."""
    by_topic: dict[str, list[Message]] = defaultdict(list)
    for topic, env in events:
        key = env.tenant_id if topic.keyed_by == "tenant" else env.correlation_id
        by_topic[topic.name].append(Message(key=key, value=encode(env), partition=0 if topic is topics.ADMIN else None))
    for name, messages in by_topic.items():
        for start in range(0, len(messages), chunk):
            log.append(name, messages[start:start + chunk])
    return len(events)
