"""The rules that decide which generation a request means (`pipelines.generation.idempotency`):
ids before submitting, the race between two submissions of one key after, and finding a
generation by either of its ids. Over a fake index and a log that only records."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from models import topics
from models.events import decode
from models.events_generation import CancelRequested, GenerationRequested, Position
from pipelines.generation import idempotency
from pipelines.generation.idempotency import KeyReused, Replay, RequestIdInUse, SharedRequest, identify, resolve_key_race
from pipelines.generation.request_index import RequestInfo
from pipelines.generation.submission import SubmitGeneration, Submitted, request_cancel

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
BODY = {"model_alias": "tiny", "input": "hi"}
BODY_SHA = idempotency.request_sha256("generations", BODY)
KEY_SHA = idempotency.key_sha256("a", "key-1")


class FakeIndex:
    """A tenant's requests in offset order. A lookup sees those up to `visible` (a read of
    the log that lags behind its appends), or further once asked to read `up_to`."""

    def __init__(self, *requests: RequestInfo, visible: int | None = None):
        self.requests, self.visible = list(requests), visible

    def _seen(self, up_to: int | None = None) -> list[RequestInfo]:
        if self.visible is None:
            return self.requests
        self.visible = max(self.visible, -1 if up_to is None else up_to)
        return [r for r in self.requests if r.offset <= self.visible]

    def request(self, tenant_id: str, request_id: str) -> RequestInfo | None:
        return next((r for r in self._seen() if (r.tenant_id, r.request_id) == (tenant_id, request_id)), None)

    def claim(self, tenant_id: str, key_sha256: str, *, up_to: int | None = None) -> idempotency.Claim | None:
        first = next((r for r in self._seen(up_to)
                      if (r.tenant_id, r.idempotency_key_sha256) == (tenant_id, key_sha256)), None)
        return first and idempotency.Claim(first.request_id, first.request_sha256, first.at, first.offset)


class RecordingLog:
    def __init__(self):
        self.appended: list[tuple[str, object]] = []

    def append(self, topic, messages):
        self.appended += [(topic, decode(m.value).payload) for m in messages]
        return []


def info(request_id: str, offset: int, *, tenant: str = "a", key: str | None = KEY_SHA, body: str | None = BODY_SHA,
         at: datetime = NOW - timedelta(hours=1), stream_offset: int = 40) -> RequestInfo:
    return RequestInfo(tenant_id=tenant, request_id=request_id, route="generations", model_alias="tiny",
                       stream_offset=stream_offset, request_sha256=body, idempotency_key_sha256=key,
                       deadline_at=None, at=at, offset=offset)


def command(request_id: str | None = None) -> SubmitGeneration:
    return SubmitGeneration(request_id=request_id, model_alias="tiny", prompt="hi", max_output_tokens=5,
                            deadline_ms=None)


def ident(cmd: SubmitGeneration, index: FakeIndex, key: str | None = None, tenant: str = "a"):
    return identify(cmd, tenant_id=tenant, body=BODY, idempotency_key=key, id_prefix="gen_", index=index, now=NOW)


# -- before submitting ------------------------------------------------------------------

def test_a_plain_request_gets_a_fresh_id_and_no_key():
    one, two = ident(command(), FakeIndex()), ident(command(), FakeIndex())
    assert one.request_id.startswith("gen_") and one.request_id != two.request_id
    assert one.idempotency_key_sha256 is None and one.request_sha256 is None


def test_a_chosen_id_goes_on_the_log_with_its_tenant_in_it():
    cmd = ident(command("order-1"), FakeIndex())
    assert cmd.request_id == idempotency.client_request_id("a", "order-1") != "order-1"


def test_a_chosen_id_already_used_by_the_tenant_is_refused_and_another_tenants_is_not():
    index = FakeIndex(info(idempotency.client_request_id("b", "order-1"), 0, tenant="b", key=None))
    assert ident(command("order-1"), index).request_id == idempotency.client_request_id("a", "order-1")
    with pytest.raises(RequestIdInUse) as refused:
        ident(command("order-1"), index, tenant="b")
    assert refused.value.chosen == "order-1"


def test_a_first_keyed_request_carries_the_key_and_body_hashes_and_an_id_from_the_key():
    cmd = ident(command(), FakeIndex(), key="key-1")
    assert (cmd.idempotency_key_sha256, cmd.request_sha256) == (KEY_SHA, BODY_SHA)
    assert cmd.request_id == idempotency.keyed_request_id("gen_", "a", "key-1", NOW)
    chosen = ident(command("order-1"), FakeIndex(), key="key-1")
    assert chosen.request_id == idempotency.client_request_id("a", "order-1"), "the client's id wins"


def test_a_retry_with_the_same_key_and_body_replays_the_first():
    index = FakeIndex(info("gen_first", 3))
    assert ident(command(), index, key="key-1") == Replay("gen_first")
    assert isinstance(ident(command(), index, key="key-2"), SubmitGeneration), "another key is another request"
    assert isinstance(ident(command(), index, key="key-1", tenant="b"), SubmitGeneration), "keys are per tenant"


def test_the_same_key_with_another_body_is_refused():
    with pytest.raises(KeyReused):
        ident(command(), FakeIndex(info("gen_first", 3, body="another body")), key="key-1")


def test_a_key_is_free_again_once_its_claim_aged_out():
    index = FakeIndex(info("gen_first", 3, body="another body", at=NOW - timedelta(hours=25)))
    assert ident(command(), index, key="key-1").request_sha256 == BODY_SHA


def test_a_malformed_key_is_refused_before_anything_is_read():
    with pytest.raises(idempotency.IdempotencyKeyInvalid):
        ident(command(), None, key="has space")


# -- after submitting: the key race -----------------------------------------------------

def submitted(request_id: str, offset: int, *, body: str = BODY_SHA) -> Submitted:
    request = GenerationRequested(
        request_id=request_id, model_alias="tiny", model_revision="tiny@1", input_tokens=1, input_sha256="x",
        max_output_tokens=5, prompt_ref=Position(topic="p", partition=0, offset=0), stream_offset=50,
        idempotency_key_sha256=KEY_SHA, request_sha256=body)
    return Submitted(request=request, tenant_id="a", stream_partition=0, request_offset=offset)


def race(ours: Submitted, index: FakeIndex):
    log = RecordingLog()
    try:
        return resolve_key_race(ours, index=index, log=log), log.appended
    except KeyReused:
        return KeyReused, log.appended


def test_ours_is_the_claim_even_when_the_index_had_not_read_it_yet():
    index = FakeIndex(info("gen_x", 7), visible=6)
    assert race(submitted("gen_x", 7), index) == (None, [])


def test_a_first_request_of_the_same_id_is_shared_from_where_its_stream_begins():
    index = FakeIndex(info("gen_x", 5, stream_offset=12), info("gen_x", 7, stream_offset=50), visible=4)
    assert race(submitted("gen_x", 7), index) == (SharedRequest(12), [])


def test_a_first_request_of_another_id_is_replayed_and_ours_cancelled():
    index = FakeIndex(info("gen_first", 5), info("gen_x", 7))
    decided, appended = race(submitted("gen_x", 7), index)
    assert decided == Replay("gen_first")
    assert appended == [(topics.REQUESTS.name, CancelRequested(request_id="gen_x", reason="client"))]


def test_a_first_request_with_another_body_wins_and_ours_is_refused():
    same_id = FakeIndex(info("gen_x", 5, body="another body"), info("gen_x", 7))
    assert race(submitted("gen_x", 7), same_id) == (KeyReused, []), "admission decides the id by the first"
    other_id = FakeIndex(info("gen_first", 5, body="another body"), info("gen_x", 7))
    assert race(submitted("gen_x", 7), other_id) == (
        KeyReused, [(topics.REQUESTS.name, CancelRequested(request_id="gen_x", reason="client"))])


def test_a_cancel_goes_on_the_log_unless_the_generation_is_known_to_be_over():
    for status in (None, "requested", "running"):
        log = RecordingLog()
        assert request_cancel("a", "gen_x", known_status=status, log=log)
        assert log.appended == [(topics.REQUESTS.name, CancelRequested(request_id="gen_x", reason="client"))]
    for status in ("completed", "failed", "cancelled", "expired", "rejected"):
        log = RecordingLog()
        assert not request_cancel("a", "gen_x", known_status=status, log=log) and log.appended == []


# -- finding a generation by either id --------------------------------------------------

def test_a_generation_is_found_by_its_id_or_the_one_its_client_chose_within_its_tenant():
    mine = info(idempotency.client_request_id("a", "order-1"), 1, key=None)
    index = FakeIndex(info("gen_1", 0, key=None), mine)
    assert idempotency.find_request("a", "gen_1", index=index).request_id == "gen_1"
    assert idempotency.find_request("a", "order-1", index=index) == mine
    assert idempotency.find_request("b", "order-1", index=index) is None
    assert idempotency.meant_ids("a", "order-1") == ("order-1", mine.request_id)
