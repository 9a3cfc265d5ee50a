"""Fair-share weights and the right to send `high`: tenant limits set by an admin event,
enforced at admission, and weighed by a pool worker's queue and slots."""
from __future__ import annotations

from collections import Counter

import pytest
from pydantic import ValidationError

from models.events import decode, encode, new_event
from models.events_admin import TenantLimitsChanged
from models.events_generation import GenerationQueued
from models.quota import Limits
from models.registry import Registry
from models.reservations import ReservationBook
from pipelines.admission.processor import handle_requested
from tests.golden.samples import HERE
from tests.unit.test_admission import GRACE, T0, registry, requested, types
from workers.fair_share import FairQueue, Headroom, Item


def limits_event(**fields):
    return new_event(TenantLimitsChanged(tenant_id="acme", actor="ops", **fields), tenant_id="acme",
                     correlation_id="admin")


def test_limits_from_an_event_that_predates_them_are_weight_one_and_no_high():
    old = decode((HERE / "TenantLimitsChanged.v1.json").read_bytes().rstrip(b"\n"))
    limits = Limits.from_payload(old.payload)
    assert limits.fair_share_weight == 1.0 and limits.may_send_high is False
    assert Registry().limits_for("nobody") == Limits() and not Limits().may_send_high


def test_limits_carry_weight_and_entitlement_and_old_bytes_stay_the_same():
    env = limits_event(max_concurrent=4, fair_share_weight=3.0, may_send_high=True)
    back = decode(encode(env))
    assert Limits.from_payload(back.payload).as_dict() | {"fair_share_weight": 3.0, "may_send_high": True,
                                                          "max_concurrent": 4} == Limits.from_payload(back.payload).as_dict()
    plain = encode(limits_event(max_concurrent=4))
    assert b"fair_share_weight" not in plain and b"may_send_high" not in plain, "absent fields stay out of the bytes"


@pytest.mark.parametrize("weight", [0, -1.0, 1001])
def test_a_weight_must_be_positive_and_bounded(weight):
    with pytest.raises(ValidationError):
        TenantLimitsChanged(tenant_id="acme", actor="ops", fair_share_weight=weight)


def test_admission_refuses_high_from_a_tenant_not_granted_it():
    book = ReservationBook()
    out = handle_requested(requested("r1", priority="high"), registry=registry(max_concurrent=5), book=book, now=T0,
                           grace=GRACE)
    assert [t for _, t in types(out)] == ["GenerationRejected", "GenerationRejected"]
    assert out[0][1].payload.reason == "priority_not_allowed" and book.open == {}
    normal = handle_requested(requested("r2"), registry=registry(max_concurrent=5), book=book, now=T0, grace=GRACE)
    assert "GenerationQueued" in [t for _, t in types(normal)], "normal priority is not affected"


def test_admission_queues_work_with_the_tenants_weight():
    out = handle_requested(requested("r1", priority="high"), registry=registry(may_send_high=True, fair_share_weight=3),
                           book=ReservationBook(), now=T0, grace=GRACE)
    [queued] = [env for _, env in out if env.event_type == "GenerationQueued"]
    assert queued.payload.fair_share_weight == 3.0
    [default] = [env for _, env in handle_requested(requested("r2"), registry=registry(), book=ReservationBook(),
                                                    now=T0, grace=GRACE) if env.event_type == "GenerationQueued"]
    assert default.payload.fair_share_weight == 1.0
    assert b"fair_share_weight" not in encode(new_event(GenerationQueued(
        request=default.payload.request, reservation_id="r", queued_at=T0), tenant_id="acme", correlation_id="r2"))


def test_items_weights_share_tokens_three_to_one_under_backlog():
    queue = FairQueue(quantum=64)
    for n in range(400):  # requests of different sizes: the share is by tokens
        queue.push(Item("gold", "normal", 40, n, weight=3.0))
        queue.push(Item("basic", "normal", 100, n, weight=1.0))
    tokens = Counter()
    while sum(tokens.values()) < 20_000:
        taken = queue.pop()
        tokens[taken.tenant_id] += taken.tokens
    assert 2.7 <= tokens["gold"] / tokens["basic"] <= 3.3, tokens


def test_headroom_shares_the_last_slots_by_weight():
    now = [0.0]
    slots = Headroom(4, clock=lambda: now[0])
    slots.seen("gold", 3.0)
    slots.seen("basic", 1.0)
    for _ in range(3):
        slots.started("gold")
    assert not slots.may_start("gold"), "gold holds its three quarters"
    assert slots.may_start("basic")
    slots.finished("gold")
    slots.started("basic")
    assert slots.may_start("gold") and not slots.may_start("basic"), "basic holds its quarter"


def test_a_small_weight_still_gets_a_slot():
    slots = Headroom(2, clock=lambda: 0.0)
    slots.seen("gold", 3.0)
    slots.started("gold", 3.0)
    slots.seen("basic", 1.0)
    assert slots.may_start("basic"), "a share below one slot rounds up, so the slot is not left idle"


def test_queue_and_slots_together_serve_a_flood_three_to_one():
    """As a pool worker uses them: every freed slot goes to the next eligible item. Runs
    take slightly different times, so slots free one at a time, each the last free one."""
    now = [0.0]
    queue, slots = FairQueue(quantum=256), Headroom(4, clock=lambda: now[0])
    for n in range(48):
        for tenant, weight in (("gold", 3.0), ("basic", 1.0)):
            queue.push(Item(tenant, "normal", 256, n, weight=weight))
            slots.seen(tenant, weight)
    running: list[tuple[float, str]] = []
    order: list[str] = []
    while len(order) < 48:
        while (taken := queue.pop(lambda i: slots.may_start(i.tenant_id))) is not None:
            slots.started(taken.tenant_id)
            order.append(taken.tenant_id)
            running.append((now[0] + 1.0 + len(order) % 7 * 0.05, taken.tenant_id))
        now[0] = min(at for at, _ in running)
        for ended in [r for r in running if r[0] == now[0]]:
            running.remove(ended)
            slots.finished(ended[1])
    got = Counter(order[8:48])  # past the first fill of the slots
    assert got == {"gold": 30, "basic": 10}, got
