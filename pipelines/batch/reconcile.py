"""What the dispatcher does next for one batch, decided from its state alone.

Level-triggered on purpose: the same state always leads to the same next step, so
redoing a unit of work after a crash or a rebalance decides the same thing again, and a
batch advances whichever event woke the dispatcher. Steps, in order:

  window passed         → BatchWindowElapsed (stop starting chunks)
  not validated         → validate: BatchValidated, or BatchFailed with an error file
  stopping              → stop marker for workers; pending chunks skipped; stale queued
                          chunks skipped, chunks running past every retry failed
  chunk ended           → BatchUsageSettled (what it used, at most what it reserved)
  room in the window    → reserve the next chunk's budget and queue it (BatchChunkQueued),
                          or, out of budget with nothing of the tenant's in flight to wait
                          for, skip the rest as insufficient_quota
  queued, not started   → sent to the queue again after `requeue_after_s` (a broker
                          restarted without persistence loses what it held); no event
  waiting on a pool     → BatchWaitingForPool, once, when the tenant's dedicated pool has
                          no live batch worker and none of the batch's chunks runs
  every chunk settled   → BatchFinalizationStarted; on the next pass, assemble the files

A tenant with a dedicated pool (its `pool` limit) has its chunks sent to that pool's own
queue, whether or not a worker of the pool is up: they wait there, never on the shared one.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable

from models import batch_keys as keys
from models.batch import BatchState, ChunkState
from models.batch_budget import BatchLimits, TenantBatchBudget
from models.events_batch import (
    BatchCancelRequested, BatchChunkFailed, BatchChunkQueued, BatchChunkSkipped, BatchFailed, BatchFinalizationStarted, BatchUsageSettled,
    BatchValidated, BatchWaitingForPool, BatchWindowElapsed, RequestCounts,
)
from models import topics
from models.registry import Registry
from pipelines import artifacts
from pipelines.admission.decisions import cost_micros
from pipelines.batch.finalize import _JsonlOut, finalize_requests, finalize_summaries
from pipelines.batch.queue import ChunkQueue
from pipelines.batch.validate import BatchInputError, validate_documents, validate_requests
from pipelines.objectstore import ObjectStore
from pipelines.outage import is_transient

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DispatchOptions:
    chunk_size: int = 64
    chunks_in_flight: int = 4
    max_requests: int = 50_000
    chunk_time_limit_s: float = 900.0
    max_retries: int = 3
    stop_grace_s: float = 60.0  # a queued chunk not started this long after a stop is skipped here
    # A queued chunk not started this long is sent again: its task may be lost with the
    # broker's data. A chunk sent twice runs once in effect (one part at a derived key, and
    # the dispatcher ignores a repeated report), so this only costs a queue entry.
    requeue_after_s: float = 600.0

    @property
    def running_timeout(self) -> timedelta:
        """Past this, a started chunk of a stopping batch has used every retry: it failed."""
        return timedelta(seconds=(self.chunk_time_limit_s + 60) * (self.max_retries + 1) + 60)


def pool_of(registry: Registry, tenant_id: str) -> str | None:
    """The tenant's dedicated pool as the registry records it; None for the shared pool."""
    pool = registry.limits_for(tenant_id).pool
    return None if pool in (None, topics.SHARED_POOL) else pool


def reservation_id(batch_id: str, chunk_index: int) -> str:
    # Deterministic, so a redone decision reserves (and sends) the very same thing.
    return f"bres_{batch_id}_{chunk_index}"


class Reconciler:
    def __init__(self, *, store: ObjectStore, queue: ChunkQueue, options: DispatchOptions,
                 budget_of: Callable[[str], TenantBatchBudget],
                 limits_for: Callable[[str, Registry], BatchLimits],
                 pool_live: Callable[[str], bool | None] | None = None):
        """`pool_live(pool)`: whether a live batch worker takes the pool's chunks (None:
        not known, and nothing is said of it)."""
        self.store, self.queue, self.options = store, queue, options
        self.budget_of, self.limits_for, self.pool_live = budget_of, limits_for, pool_live
        self._stopped: set[tuple[str, str]] = set()  # stop markers written by this process
        self._sent: dict[tuple[str, int], datetime] = {}  # when this process last sent a queued chunk again

    def reconcile(self, batch: BatchState, emit: Callable, *, registry: Registry, now: datetime) -> None:
        """Decides the next steps of `batch`; `emit(payload)` applies and records each event."""
        if batch.terminal:
            return
        if batch.tenant_id in registry.suspended and batch.status in ("validating", "in_progress") \
                and not batch.cancel_requested:
            emit(BatchCancelRequested(batch_id=batch.batch_id))  # a suspended tenant's work ends, cancelled
        if not batch.window_elapsed and now >= batch.expires_at:
            emit(BatchWindowElapsed(batch_id=batch.batch_id))
        if not batch.validated:
            if batch.stopping:
                self._stop_marker(batch)
                return self._finalize(batch, emit)
            self._validate(batch, emit, registry)
            if batch.terminal:
                return
        if batch.stopping or batch.finalizing:
            self._stop_marker(batch)
        if batch.stopping:
            self._stop_chunks(batch, emit, now)
        for chunk in batch.chunks:
            if chunk.needs_settlement:
                emit(self._settlement(batch, chunk, registry))
        if not batch.stopping:
            self._resend_unstarted(batch, registry, now)
            self._queue_chunks(batch, emit, registry, now)
            self._note_waiting(batch, emit, registry)
        if batch.all_chunks_terminal():
            if not batch.finalizing:
                emit(BatchFinalizationStarted(batch_id=batch.batch_id))
            else:
                self._finalize(batch, emit)

    def _validate(self, batch: BatchState, emit: Callable, registry: Registry) -> None:
        validate = validate_documents if batch.summarization else validate_requests
        try:
            result = validate(batch, store=self.store, registry=registry, chunk_size=self.options.chunk_size,
                              max_requests=self.options.max_requests)
        except Exception as exc:
            if isinstance(exc, OSError) or is_transient(exc):
                raise  # the store is unreachable: the unit is redone later
            if not isinstance(exc, BatchInputError):
                # A fault in this input that validation did not foresee: fail this batch
                # rather than retry it forever, holding up every batch of its partition.
                logger.exception("validating %s failed", batch.batch_id)
                exc = BatchInputError("validation_error", f"the input could not be validated: "
                                      f"{type(exc).__name__}: {exc}")
            error_file = None
            if exc.invalid:  # every line was bad: the error file says why, line by line
                out = _JsonlOut()
                for line in exc.invalid:
                    out.write(line)
                error_file = out.store(self.store, batch, keys.error_file_id(batch.batch_id),
                                       f"{batch.batch_id}_errors.jsonl")
                emit(error_file)
            emit(BatchFailed(batch_id=batch.batch_id, errors=(exc.error,),
                             error_file_id=error_file and error_file.file_id,
                             request_counts=RequestCounts(total=exc.total, failed=len(exc.invalid))))
            return
        if result.invalid:
            out = _JsonlOut()
            for line in result.invalid:
                out.write(line)
            out.file.flush()
            self.store.put_file(keys.invalid_lines_key(batch.tenant_id, batch.batch_id), out.file.name)
            out.file.close()
        emit(BatchValidated(batch_id=batch.batch_id, model_alias=result.model_alias,
                            model_revision=result.revision.model_revision, total_requests=result.total,
                            invalid_requests=len(result.invalid), chunks=tuple(result.chunks)))

    def _stop_marker(self, batch: BatchState) -> None:
        if (batch.tenant_id, batch.batch_id) not in self._stopped:
            reason = "batch_expired" if batch.window_elapsed and not batch.cancel_requested else "batch_cancelled"
            self.store.put_bytes(keys.stop_marker_key(batch.tenant_id, batch.batch_id), reason.encode())
            self._stopped.add((batch.tenant_id, batch.batch_id))

    def _stop_chunks(self, batch: BatchState, emit: Callable, now: datetime) -> None:
        reason = "batch_cancelled" if batch.cancel_requested else "batch_expired"
        grace = timedelta(seconds=self.options.stop_grace_s)
        stopped_at = batch.times.get("cancelling_at") if batch.cancel_requested else batch.expires_at
        for chunk in batch.chunks:
            if chunk.status == "pending":
                emit(BatchChunkSkipped(batch_id=batch.batch_id, chunk_index=chunk.index, reason=reason))
            elif chunk.status == "queued" and now - max(stopped_at or now, chunk.queued_at or now) > grace:
                # Workers skip a stopped batch's chunks themselves; this covers a lost task.
                emit(BatchChunkSkipped(batch_id=batch.batch_id, chunk_index=chunk.index, reason=reason))
            elif chunk.status == "running" and chunk.started_at and \
                    now - chunk.started_at > self.options.running_timeout:
                emit(BatchChunkFailed(batch_id=batch.batch_id, chunk_index=chunk.index, error_code="timeout",
                                      message="the chunk did not report within its time limits"))

    def _settlement(self, batch: BatchState, chunk: ChunkState, registry: Registry) -> BatchUsageSettled:
        revision = registry.revisions.get(batch.model_revision or "")
        used_tokens = min(chunk.reserved_tokens, chunk.input_tokens + chunk.output_tokens)
        used_cost = min(chunk.reserved_cost_micros, cost_micros(revision, chunk.input_tokens, chunk.output_tokens))
        return BatchUsageSettled(
            batch_id=batch.batch_id, chunk_index=chunk.index, reservation_id=chunk.reservation_id,
            input_tokens=chunk.input_tokens, output_tokens=chunk.output_tokens, cost_micros=used_cost,
            released_tokens=chunk.reserved_tokens - used_tokens,
            released_cost_micros=chunk.reserved_cost_micros - used_cost)

    def _queue_chunks(self, batch: BatchState, emit: Callable, registry: Registry, now: datetime) -> None:
        budget, limits = self.budget_of(batch.tenant_id), self.limits_for(batch.tenant_id, registry)
        revision = registry.revisions.get(batch.model_revision or "")
        if revision is None:
            return  # the revision's approval is not in this registry yet; the next pass sees it
        room = self.options.chunks_in_flight - len(batch.in_flight())
        for chunk in batch.pending()[:max(0, room)]:
            if not budget.fits(limits, chunk.tokens, chunk.cost_micros, now):
                if not budget.open:  # nothing in flight will give budget back: this batch is out
                    for rest in batch.pending():
                        emit(BatchChunkSkipped(batch_id=batch.batch_id, chunk_index=rest.index,
                                               reason="insufficient_quota"))
                return
            res_id = reservation_id(batch.batch_id, chunk.index)
            self.queue.enqueue(self._task(batch, chunk, revision, res_id, registry))
            emit(BatchChunkQueued(batch_id=batch.batch_id, chunk_index=chunk.index, reservation_id=res_id,
                                  tokens=chunk.tokens, cost_micros=chunk.cost_micros))

    def _resend_unstarted(self, batch: BatchState, registry: Registry, now: datetime) -> None:
        revision = registry.revisions.get(batch.model_revision or "")
        after = timedelta(seconds=self.options.requeue_after_s)
        for chunk in batch.chunks:
            key = (batch.batch_id, chunk.index)
            if chunk.status != "queued" or revision is None:
                self._sent.pop(key, None)
                continue
            last = max(filter(None, (chunk.queued_at, self._sent.get(key))), default=now)
            if now - last > after:
                logger.warning("chunk %s/%s queued %s ago and not started; sending it again",
                               batch.batch_id, chunk.index, now - (chunk.queued_at or now))
                self.queue.enqueue(self._task(batch, chunk, revision, chunk.reservation_id, registry))
                self._sent[key] = now

    def _note_waiting(self, batch: BatchState, emit: Callable, registry: Registry) -> None:
        """Says once that the batch waits for its pool's worker: only while chunks are queued,
        none runs, and the pool's workers are known to be gone."""
        pool = pool_of(registry, batch.tenant_id)
        if pool is None or self.pool_live is None or batch.waiting_for_pool == pool:
            return
        if not any(c.status == "queued" for c in batch.chunks) or any(c.status == "running" for c in batch.chunks):
            return
        if self.pool_live(pool) is False:
            emit(BatchWaitingForPool(batch_id=batch.batch_id, pool=pool))

    def _task(self, batch: BatchState, chunk: ChunkState, revision, res_id: str, registry: Registry) -> dict:
        spec = batch.summarization
        pool = pool_of(registry, batch.tenant_id)
        return ({"pool": pool} if pool else {}) | {
            "tenant_id": batch.tenant_id, "batch_id": batch.batch_id, "chunk_index": chunk.index,
            "reservation_id": res_id, "endpoint": batch.endpoint, "model_alias": batch.model_alias,
            "model_revision": revision.model_revision, "model_path": revision.model_path,
            "engine_config_hash": revision.engine_config_hash, "max_model_len": revision.max_model_len,
            "input_key": keys.chunk_input_key(batch.tenant_id, batch.batch_id, chunk.index),
            "part_key": keys.summary_part_key(spec.output_prefix, chunk.index) if spec
            else keys.part_key(batch.tenant_id, batch.batch_id, chunk.index),
            "summarization": spec.model_dump(mode="json") if spec else None,
            # the approved files, as one digest: a batch worker refuses a directory that differs
            "artifact_manifest": (artifacts.manifest_digest(revision.artifact_digests)
                                  if revision.artifact_digests else None),
            # how the revision's engine is built, so the batch worker builds the same (and hashes the same)
            "engine_settings": revision.engine_settings.model_dump() if revision.engine_settings else None,
        }

    def _finalize(self, batch: BatchState, emit: Callable) -> None:
        # A batch stopped before validation has no chunks: its files come out empty.
        finalize = finalize_summaries if batch.summarization else finalize_requests
        for payload in finalize(batch, store=self.store):
            emit(payload)
