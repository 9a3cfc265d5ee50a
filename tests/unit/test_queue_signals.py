"""Admission's queue as an autoscaler reads it: per (pool, revision), the work queued and not
seen started or ended, and how long the oldest of it has waited."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from models.events_generation import GenerationFailed
from pipelines.admission.capacity import CapacityBook, key_of

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
A, B = key_of(None, "tiny@1"), key_of("dedicated", "tiny@2")


def book_at(clock: list[datetime]) -> CapacityBook:
    return CapacityBook(None, clock=lambda: clock[0])


def test_depth_and_oldest_age_per_pool_and_revision():
    clock = [T0]
    book = book_at(clock)
    book.queued("r1", A, "normal")
    clock[0] = T0 + timedelta(seconds=3)
    book.queued("r2", A, "high")
    book.queued("r3", B, "normal")
    book.queued("r3", B, "normal")  # the same request twice is queued once
    signals = book.queue_signals(T0 + timedelta(seconds=10))
    assert signals == {A: (2, 10.0), B: (1, 7.0)}


def test_started_ended_and_pruned_work_leaves_the_queue_and_its_age():
    clock = [T0]
    book = book_at(clock)
    book.queued("old", A, "normal")
    clock[0] = T0 + timedelta(seconds=5)
    book.queued("new", A, "normal")
    book.queued("gone", B, "normal")
    book.started("old", A, queued_ms=5000)
    now = T0 + timedelta(seconds=6)
    assert book.queue_signals(now) == {A: (1, 1.0), B: (1, 1.0)}
    book.ended("new", A, GenerationFailed(request_id="new", error_code="x", message="x"))
    book.prune(open_ids=set())
    # A pool and revision that had work stays reported, at zero: a series that vanishes reads as no data.
    assert book.queue_signals(now) == {A: (0, 0.0), B: (0, 0.0)}


def test_a_rebalance_forgets_the_queue():
    book = book_at([T0])
    book.queued("r1", A, "normal")
    book.forget_queue()
    assert book.queue_signals(T0 + timedelta(seconds=1)) == {}
