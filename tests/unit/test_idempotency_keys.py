"""`Idempotency-Key` on files, batches, summarizations and cancels
(`pipelines.idempotency_keys`), on the embedded log: a claim, its answer, a conflict, a
fresh book (another replica, or an API after a restart) that reads them back, a race of
two books, a released key, and the generation fallback's derived key."""
from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from models import topics
from models.events import decode
from pipelines.bootstrap import topic_specs
from pipelines.eventlog.embedded import EmbeddedEventLog
from pipelines.generation import idempotency
from pipelines.generation.idempotency import IdempotencyKeyInvalid, KeyReused
from pipelines import idempotency_keys
from pipelines.idempotency_keys import Answered, KeyBook, KeyInProgress, Mine, keyed_request
from tests.unit.test_idempotency_rules import FakeIndex, command, ident, info

BODY = {"input_file_id": "file-1", "endpoint": "/v1/chat/completions"}


@pytest.fixture
def log(tmp_path):
    log = EmbeddedEventLog(tmp_path / "log.db")
    log.ensure_topics(topic_specs())
    yield log
    log.close()


def keyed(key: str = "key-1", body: dict = BODY, tenant: str = "a"):
    return keyed_request(tenant, key, "batches", body, b"tenant-digest-key")


def types_on(log) -> list[str]:
    return [decode(r.value).event_type for r in log.read_topic(topics.BATCHES.name)]


def test_a_retry_gets_the_first_answer_and_a_fresh_book_reads_it_back(log):
    book = KeyBook(log)
    mine = book.begin(keyed())
    assert isinstance(mine, Mine)
    book.record(mine, {"id": "batch_1", "status": "validating"})
    assert book.begin(keyed()) == Answered({"id": "batch_1", "status": "validating"})
    restarted = KeyBook(log)  # another replica, or the API after a restart: only the log is shared
    assert restarted.begin(keyed()) == Answered({"id": "batch_1", "status": "validating"})
    assert types_on(log) == ["IdempotencyKeyClaimed", "IdempotentResponseRecorded"], "retries append nothing"


def test_another_body_is_a_conflict_and_keys_are_per_tenant(log):
    book = KeyBook(log)
    book.record(book.begin(keyed()), {"id": "batch_1"})
    with pytest.raises(KeyReused):
        KeyBook(log).begin(keyed(body={**BODY, "metadata": {"x": "y"}}))
    assert isinstance(book.begin(keyed(tenant="b")), Mine), "another tenant's same key is its own"


def test_a_released_key_runs_again(log):
    book = KeyBook(log)
    book.release(book.begin(keyed()))
    again = KeyBook(log).begin(keyed())
    assert isinstance(again, Mine)


def test_a_racing_retry_waits_for_the_first_answer(log):
    first, second = KeyBook(log), KeyBook(log, wait_s=10, poll_s=0.01)
    mine = first.begin(keyed())
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(second.begin(keyed())))
    waiter.start()
    first.record(mine, {"id": "file-1"})
    waiter.join(10)
    assert got == [Answered({"id": "file-1"})]


def test_an_unanswered_claim_holds_the_key_only_for_a_while(log, monkeypatch):
    KeyBook(log).begin(keyed())  # its API died before answering
    with pytest.raises(KeyInProgress):
        KeyBook(log, wait_s=0.05, poll_s=0.01).begin(keyed())
    monkeypatch.setattr(idempotency_keys, "PENDING", timedelta(0))
    assert isinstance(KeyBook(log).begin(keyed()), Mine), "an abandoned claim no longer holds the key"


@pytest.mark.parametrize("bad", ["", "x" * 256, "has space", "tab\there"])
def test_an_empty_over_long_or_unprintable_key_is_refused(bad):
    with pytest.raises(IdempotencyKeyInvalid, match="Idempotency-Key"):
        keyed(bad)


# -- a generation that a fallback served ----------------------------------------------

def test_the_fallback_key_is_a_valid_key_of_its_own():
    derived = idempotency.fallback_key("k" * 255, 1)
    assert idempotency.validate_key(derived) == derived != idempotency.fallback_key("k" * 255, 2)


def test_a_retry_of_a_keyed_request_a_fallback_served_replays_the_fallback():
    fb_sha = idempotency.key_sha256("a", idempotency.fallback_key("key-1", 1))
    # The request itself never reached the log (refused for capacity before); its fallback did.
    index = FakeIndex(info("gen_fallback", 4, key=fb_sha))
    assert ident(command(), index, key="key-1") == idempotency.Replay("gen_fallback")
    # Refused by admission on the log, then served by the second fallback: that one is meant.
    index = FakeIndex(info("gen_first", 2), info("gen_fb1", 3, key=fb_sha),
                      info("gen_fb2", 5, key=idempotency.key_sha256("a", idempotency.fallback_key("key-1", 2))))
    assert ident(command(), index, key="key-1") == idempotency.Replay("gen_fb2")
    assert isinstance(ident(command(), index, key="key-2"), type(command())), "another key: a new request"
    with pytest.raises(KeyReused):
        ident(command(), FakeIndex(info("gen_fallback", 4, key=fb_sha, body="another body")), key="key-1")
