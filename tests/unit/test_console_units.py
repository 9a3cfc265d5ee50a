"""The console's helpers on their own: money to the micro-unit, charts that escape what they
draw, sessions that a forged or expired cookie cannot open, the same-origin check, limits
that never say 'unlimited', exports that read back as written, and the rollup's moves."""
from __future__ import annotations

import csv
import io
from datetime import datetime, timezone
from types import SimpleNamespace

import pyarrow.parquet as pq

from api.console.auth import same_origin
from api.console.export import csv_chunks, filled, parquet_chunks
from api.console.pages import limit_rows
from api.console.render import bar_chart, micros
from api.console.session import SessionStore
from models.quota import Limits
from models.registry import Registry, Revision
from pipelines.projections.console import EXPORT_COLUMNS
from pipelines.projections.usage_daily import Rollup


def test_money_is_shown_exactly_to_the_micro_unit():
    assert micros(0) == "0.000000"
    assert micros(1) == "0.000001"
    assert micros(12_345_678_901) == "12,345.678901"
    assert micros(-5) == "-0.000005"
    assert micros(None) == "—"


def test_a_chart_escapes_its_labels_and_says_when_it_is_empty():
    svg = str(bar_chart([("<script>alert(1)</script>", 5), ("b", 10)], title="Spend"))
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert svg.count("<rect") == 2 and "max 0.000010" in svg
    assert "No spend" in str(bar_chart([], title="Spend"))


def test_sessions_open_only_with_their_own_signed_cookie():
    store = SessionStore(ttl_s=60)
    session, cookie = store.open("ab" * 32)
    assert store.get(cookie) is session and session.secret_sha256 == "ab" * 32
    sid, _, mac = cookie.rpartition(".")
    assert store.get(f"{sid}.{mac[:-1]}x") is None
    assert store.get(sid) is None and store.get(None) is None and store.get("") is None
    assert SessionStore(ttl_s=60).get(cookie) is None, "another process's key signs other cookies"
    store.close(cookie)
    assert store.get(cookie) is None


def test_sessions_expire_and_are_bounded():
    expired = SessionStore(ttl_s=0)
    _, cookie = expired.open(None)
    assert expired.get(cookie) is None
    small = SessionStore(ttl_s=60, max_sessions=3)
    cookies = [small.open(None)[1] for _ in range(5)]
    assert len(small) == 3 and small.get(cookies[0]) is None and small.get(cookies[-1]) is not None


def _request(**headers):
    return SimpleNamespace(headers={k.replace("_", "-"): v for k, v in headers.items()})


def test_forms_must_come_from_the_console_itself():
    assert same_origin(_request(host="127.0.0.1:8000"))  # no Origin: not a cross-site browser form
    assert same_origin(_request(host="127.0.0.1:8000", origin="http://127.0.0.1:8000"))
    assert not same_origin(_request(host="127.0.0.1:8000", origin="https://evil.example"))
    assert not same_origin(_request(host="127.0.0.1:8000", referer="https://evil.example/page"))
    assert not same_origin(_request(host="127.0.0.1:8000", origin="null"))


def _quota(tokens=0, cost=0, reserved_tokens=0, rpm=0, open_=0):
    return {"used": {"requests_last_minute": rpm, "tokens": tokens, "cost_micros": cost},
            "reserved": {"concurrent": open_, "tokens": reserved_tokens, "cost_micros": 0}}


def test_limits_are_those_in_force_and_an_unset_one_names_what_bounds_it():
    registry = Registry()
    registry.revisions["r"] = Revision("r", "/m", "h", 2048, 0, 0)
    registry.grants["t"] = Limits(tokens_per_window=1000, max_output_tokens=64)
    registry.own_limits["t"] = {"max_output_tokens": 32}
    registry.limits["t"] = Limits(tokens_per_window=1000, max_output_tokens=32)
    rows = {r["name"]: r for r in limit_rows(registry, "t", _quota(tokens=300, reserved_tokens=200))}
    assert rows["tokens_per_window"]["remaining"] == 500, "open reservations count in full"
    assert rows["max_output_tokens"]["limit"] == 32 and rows["max_output_tokens"]["granted"] == 64
    assert "2,048" in rows["max_input_tokens"]["bound"]
    assert rows["requests_per_minute"]["bound"] == "not set"
    assert not any("unlimited" in str(r).lower() for r in rows.values())


ROW = ("t1", "generation", "gen_1", None, "chat", "key_1", "tiny", "tiny@r1", 40, 12, None, 9, None, 7, 20, 300,
       "stop", "completed", datetime(2025, 5, 1, 12, 0, tzinfo=timezone.utc), "2025-05-01")


def test_exports_read_back_as_written():
    batches = [[ROW, ROW[:2] + ("gen_2",) + ROW[3:]], [ROW[:2] + ("gen_3",) + ROW[3:]]]
    text = b"".join(csv_chunks(iter(batches), chunk_bytes=10)).decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["source_id"] for r in rows] == ["gen_1", "gen_2", "gen_3"]
    assert rows[0]["cost_micros"] == "9" and rows[0]["settled_at"] == "2025-05-01T12:00:00.000000Z"
    data = b"".join(parquet_chunks(iter(batches), row_group=2))
    table = pq.read_table(io.BytesIO(data))
    assert table.num_rows == 3 and table.column_names == list(EXPORT_COLUMNS)
    assert pq.ParquetFile(io.BytesIO(data)).metadata.num_row_groups == 2
    assert b"".join(parquet_chunks(iter([]))) and pq.read_table(io.BytesIO(b"".join(parquet_chunks(iter([]))))
                                                               ).num_rows == 0


def _row(**cells) -> tuple:
    return tuple(cells.get(name, value) for name, value in zip(EXPORT_COLUMNS, ROW))


def test_the_export_fills_delivered_tokens_and_cached_as_the_other_views_read_them():
    # NULL delivered: the whole output reached the client; NULL cached: not from the cache.
    whole, early = _row(output_tokens=12), _row(source_id="gen_2", delivered_output_tokens=5, cached=True)
    over = _row(source_id="gen_3", delivered_output_tokens=40)  # never more than were generated
    chunk = _row(source="batch_chunk", source_id="b:0", batch_id="b", delivered_output_tokens=None, cached=False)
    rows = [filled(r) for r in (whole, early, over, chunk)]
    text = b"".join(csv_chunks(iter([rows]))).decode()
    shown = [(r["delivered_output_tokens"], r["cached"]) for r in csv.DictReader(io.StringIO(text))]
    assert shown == [("12", "false"), ("5", "true"), ("12", "false"), ("12", "false")]
    table = pq.read_table(io.BytesIO(b"".join(parquet_chunks(iter([rows])))))
    assert table.column("delivered_output_tokens").to_pylist() == [12, 5, 12, 12]
    assert table.column("cached").to_pylist() == [False, True, False, False]
    assert table.column("delivered_output_tokens").null_count == 0 and table.column("cached").null_count == 0
    # The other columns pass through as they are.
    assert filled(whole)[:10] == whole[:10] and filled(whole)[13:] == whole[13:]


def _ledger(**overrides):
    row = {"tenant_id": "t", "day": "2025-05-01", "application_id": None, "key_id": "k", "model_revision": "r",
           "source": "generation", "input_tokens": 4, "output_tokens": 2, "delivered_output_tokens": None,
           "cost_micros": 9, "cached": None}
    return {**row, **overrides}


def test_the_rollup_moves_a_row_whose_key_changes_and_ignores_one_that_did_not():
    rollup = Rollup()
    rollup.change(_ledger(), _ledger())
    assert not rollup._deltas
    rollup.change(_ledger(), _ledger(application_id="chat", delivered_output_tokens=1))
    assert rollup._deltas[("t", "2025-05-01", "", "k", "r")] == [-1, 0, 0, -4, -2, -2, -9]
    assert rollup._deltas[("t", "2025-05-01", "chat", "k", "r")] == [1, 0, 0, 4, 2, 1, 9]
    assert rollup._shrunk == {("t", "2025-05-01", "", "k", "r")}
