"""Hash chains, checkpoint signatures, and the verify walk, without a database: each
kind of tampering is reported at the position where it happened."""
from __future__ import annotations

import base64
import hashlib

import pytest

from models.audit_chain import event_hash, genesis, next_link
from pipelines.signing import (
    Ed25519Signer, Ed25519Verifier, HmacSigner, checkpoint_message, signer_from_key,
)
from pipelines.audit.verify import VerifyReport, _walk
from pipelines.eventlog import Record

TOPIC, PARTITION, EVERY = "ledgerlm.ledger", 3, 4


def records(n: int) -> list[Record]:
    return [Record(TOPIC, PARTITION, i, "k", f'{{"n":{i}}}'.encode(), 0) for i in range(n)]


def trail_of(recs: list[Record]) -> tuple[list[tuple], dict]:
    """What the trail projection stores for these records: rows and signed checkpoints."""
    rows, signed, previous = [], {}, genesis(TOPIC, PARTITION)
    for seq, r in enumerate(recs, start=1):
        h = event_hash(r.value)
        previous = next_link(previous, h)
        rows.append((r.offset, seq, h, previous))
        if seq % EVERY == 0:
            signed[seq] = (r.offset, previous)
    return rows, signed


def walk(recs, rows, signed):
    report = VerifyReport()
    return _walk(iter(recs), iter(rows), signed, EVERY, TOPIC, PARTITION, report), report


def test_links_follow_the_definition_and_genesis_binds_the_partition():
    h = event_hash(b"x")
    assert h == hashlib.sha256(b"x").digest()
    assert next_link(genesis(TOPIC, 0), h) == hashlib.sha256(genesis(TOPIC, 0) + h).digest()
    assert genesis(TOPIC, 0) != genesis(TOPIC, 1) != genesis("ledgerlm.admin", 1)


def test_a_clean_log_verifies():
    recs = records(10)
    rows, signed = trail_of(recs)
    found, report = walk(recs, rows, signed)
    assert found is None and report.records == 10 and report.unsigned_tail == 2


def test_an_altered_record_is_reported_at_its_offset_with_both_hashes():
    recs = records(10)
    rows, signed = trail_of(recs)
    recs[5] = Record(TOPIC, PARTITION, 5, "k", b'{"n":500}', 0)
    found, _ = walk(recs, rows, signed)
    assert (found.offset, found.kind) == (5, "event_changed")
    assert found.expected == rows[5][2].hex() and found.found == hashlib.sha256(b'{"n":500}').hexdigest()


def test_a_removed_record_is_reported_whether_offsets_close_up_or_leave_a_gap():
    recs = records(10)
    rows, signed = trail_of(recs)
    shifted = recs[:4] + [Record(TOPIC, PARTITION, r.offset - 1, r.key, r.value, 0) for r in recs[5:]]
    assert walk(shifted, rows, signed)[0].offset == 4
    gap = recs[:4] + recs[5:]
    found, _ = walk(gap, rows, signed)
    assert (found.offset, found.kind) == (4, "record_missing")
    found, _ = walk(recs[:9], rows, signed)
    assert (found.offset, found.kind) == (9, "record_missing")


def test_an_inserted_and_a_reordered_record_are_reported_where_they_start():
    recs = records(10)
    rows, signed = trail_of(recs)
    inserted = recs[:6] + [Record(TOPIC, PARTITION, 6, "k", b'{"forged":1}', 0)] + [
        Record(TOPIC, PARTITION, r.offset + 1, r.key, r.value, 0) for r in recs[6:]]
    assert walk(inserted, rows, signed)[0].offset == 6
    swapped = list(recs)
    swapped[2], swapped[3] = (Record(TOPIC, PARTITION, 2, "k", recs[3].value, 0),
                              Record(TOPIC, PARTITION, 3, "k", recs[2].value, 0))
    found, _ = walk(swapped, rows, signed)
    assert (found.offset, found.kind) == (2, "event_changed")


def test_an_altered_trail_row_is_told_apart_from_an_altered_record():
    recs = records(10)
    rows, signed = trail_of(recs)
    bad_hash = list(rows)
    bad_hash[7] = (7, 8, b"\0" * 32, rows[7][3])
    found, _ = walk(recs, bad_hash, signed)
    assert (found.offset, found.kind) == (7, "trail_changed")
    bad_link = list(rows)
    bad_link[3] = (3, 4, rows[3][2], b"\1" * 32)
    found, _ = walk(recs, bad_link, signed)
    assert (found.offset, found.kind) == (3, "trail_changed")


def test_a_consistent_rewrite_of_log_and_trail_breaks_on_the_signed_checkpoint():
    recs = records(10)
    _, signed = trail_of(recs)
    recs[1] = Record(TOPIC, PARTITION, 1, "k", b'{"n":"rewritten"}', 0)
    rewritten_rows, _ = trail_of(recs)  # an attacker without the key recomputes the chain
    found, _ = walk(recs, rewritten_rows, signed)
    assert (found.offset, found.kind) == (3, "checkpoint_mismatch")
    found, _ = walk(recs, rewritten_rows, {})  # and deleting the checkpoints does not help
    assert (found.offset, found.kind) == (3, "checkpoint_missing")


def test_a_trail_shorter_than_the_log_is_lag_not_tampering():
    recs = records(10)
    rows, signed = trail_of(recs[:6])
    found, report = walk(recs, rows, signed)
    assert found is None and report.not_in_trail == 4


def test_hmac_signatures_verify_only_with_the_key_and_the_same_message():
    signer = HmacSigner(b"k1")
    message = checkpoint_message(TOPIC, 0, 1000, 1234, b"\2" * 32)
    signature = signer.sign(message)
    assert signer.verify(message, signature) and signature == HmacSigner(b"k1").sign(message)
    assert not HmacSigner(b"k2").verify(message, signature)
    assert not signer.verify(checkpoint_message(TOPIC, 0, 1000, 1235, b"\2" * 32), signature)
    assert signer.key_id != HmacSigner(b"k2").key_id
    with pytest.raises(ValueError):
        HmacSigner(b"")


def test_ed25519_signatures_verify_with_the_public_key_alone():
    seed = bytes(range(32))
    signer = signer_from_key("ed25519:" + base64.urlsafe_b64encode(seed).decode())
    assert isinstance(signer, Ed25519Signer)
    message = checkpoint_message(TOPIC, 0, 1000, 5, b"\3" * 32)
    signature = signer.sign(message)
    public = Ed25519Verifier.from_base64(signer.public_base64())
    assert public.verify(message, signature) and public.key_id == signer.key_id
    assert not public.verify(message + b" ", signature) and not public.verify(message, "zz")
    assert signer.sign(message) == signature  # deterministic: a replay signs the same heads
