"""Deficit round robin by tokens across tenants, strict priority, and the kept slot."""
from __future__ import annotations

from collections import Counter

from workers.fair_share import FairQueue, Headroom, Item


def item(tenant: str, tokens: int = 100, priority: str = "normal", n: int = 0) -> Item:
    return Item(tenant, priority, tokens, f"{tenant}-{n}")


def drain(queue: FairQueue, count: int | None = None, **kw) -> list[Item]:
    out = []
    while (count is None or len(out) < count) and (nxt := queue.pop(**kw)) is not None:
        out.append(nxt)
    return out


def test_a_flood_does_not_delay_a_light_tenant_behind_it():
    queue = FairQueue(quantum=100)
    for n in range(100):
        queue.push(item("flood", n=n))
    queue.push(item("light"))
    first = drain(queue, 3)
    assert "light" in [i.tenant_id for i in first], "the light tenant starts within one round"


def test_busy_tenants_get_equal_tokens_whatever_their_request_sizes():
    queue = FairQueue(quantum=64)
    for n in range(400):
        queue.push(item("small", tokens=10, n=n))
    for n in range(40):
        queue.push(item("large", tokens=100, n=n))
    tokens = Counter()
    for taken in drain(queue, 200):
        tokens[taken.tenant_id] += taken.tokens
    # DRR bound: the gap never exceeds one quantum plus the largest request.
    assert abs(tokens["small"] - tokens["large"]) <= 64 + 100, tokens


def test_weights_share_tokens_in_proportion():
    queue = FairQueue(quantum=50, weight=lambda t: 3.0 if t == "gold" else 1.0)
    for n in range(300):
        queue.push(item("gold", tokens=50, n=n))
        queue.push(item("basic", tokens=50, n=n))
    got = Counter(i.tenant_id for i in drain(queue, 200))
    assert got["gold"] == 150 and got["basic"] == 50


def test_high_priority_goes_first_and_order_within_a_tenant_is_kept():
    queue = FairQueue()
    for n in range(3):
        queue.push(item("a", n=n))
    queue.push(item("b", priority="high"))
    taken = drain(queue)
    assert taken[0].value == "b-0"
    assert [i.value for i in taken[1:]] == ["a-0", "a-1", "a-2"]


def test_an_ineligible_tenant_is_skipped_not_lost():
    queue = FairQueue()
    queue.push(item("a"))
    queue.push(item("b"))
    assert queue.pop(eligible=lambda i: i.tenant_id == "b").tenant_id == "b"
    assert queue.pop(eligible=lambda i: False) is None
    assert queue.pop().tenant_id == "a" and len(queue) == 0


def test_dropped_items_are_never_started():
    queue = FairQueue()
    kept, gone = item("a", n=1), item("a", n=2)
    queue.push(gone)
    queue.push(kept)
    queue.drop(gone)
    assert len(queue) == 1
    assert drain(queue) == [kept]
    queue.push(only := item("b"))
    queue.drop(only)
    assert queue.pop() is None and queue.queued_tenants() == set()


def test_idle_tenants_keep_no_credit():
    queue = FairQueue(quantum=1000)
    queue.push(item("a", tokens=10))
    drain(queue)
    queue.push(item("a", tokens=10, n=1))
    queue.push(item("b", tokens=10))
    assert [i.tenant_id for i in drain(queue)] == ["a", "b"]


def test_headroom_keeps_the_last_slot_from_a_heavy_tenant_while_another_is_active():
    now = [0.0]
    slots = Headroom(4, recent_s=5.0, clock=lambda: now[0])
    for _ in range(3):
        assert slots.may_start("heavy")
        slots.started("heavy")
    assert slots.may_start("heavy"), "alone, a tenant may use every slot"
    slots.seen("light")
    assert not slots.may_start("heavy"), "the last slot is kept for the light tenant"
    assert slots.may_start("light")
    slots.started("light")
    assert slots.free == 0 and not slots.may_start("light")
    slots.finished("light")
    now[0] = 10.0  # the light tenant has gone quiet
    assert slots.may_start("heavy")


def test_take_ahead_is_for_a_lone_tenant_or_one_under_its_fair_share():
    now = [0.0]
    slots = Headroom(4, take_ahead=4, recent_s=5.0, clock=lambda: now[0])
    for _ in range(8):
        assert slots.may_start("heavy"), "alone, a tenant fills the engine and the take-ahead"
        slots.started("heavy")
    assert slots.free == 0 and not slots.may_start("heavy")
    for _ in range(5):
        slots.finished("heavy")
    assert sum(slots.in_flight.values()) == 3
    slots.seen("light")
    assert not slots.may_start("heavy"), "with another tenant active, the last engine slot is not the heavy one's"
    assert slots.may_start("light")
    slots.started("light")
    assert not slots.may_start("heavy"), "nor is the take-ahead"
    assert slots.may_start("light"), "a tenant under its fair share may wait inside the engine"
    now[0] = 10.0  # the light tenant has gone quiet
    assert slots.may_start("heavy")
