"""The daily usage rollup (`usage_daily`), kept beside the usage ledger.

Each ledger row counts once in the rollup row of its (tenant, day, application, key,
revision). A projection that writes ledger rows hands this the row as it was before the
batch (if any) and as it is after, so a ledger row whose dimensions or delivered count
change later (a replay may see the settlement before the request that names the key)
moves between rollup rows instead of counting twice. The rollup is then the sum of the
final ledger rows, whatever order the events came in, and a replay gives the same rows.
"""
from __future__ import annotations

from sqlalchemy import Connection, and_, tuple_

from models.tables import usage_daily
from pipelines.projections.sql import add_to

KEY = ("tenant_id", "day", "application_id", "key_id", "model_revision")
COUNTERS = ("generations", "batch_chunks", "cached", "input_tokens", "output_tokens", "delivered_output_tokens",
            "cost_micros")
DELETE_CHUNK = 200


def key_of(ledger_row: dict) -> tuple:
    return tuple(ledger_row.get(name) or "" for name in KEY)


def contribution(ledger_row: dict) -> tuple[int, ...]:
    """What one ledger row adds to its rollup row, in `COUNTERS` order."""
    output = int(ledger_row["output_tokens"] or 0)
    delivered = ledger_row.get("delivered_output_tokens")
    generation = ledger_row["source"] == "generation"
    return (1 if generation else 0, 0 if generation else 1, 1 if ledger_row.get("cached") else 0,
            int(ledger_row["input_tokens"] or 0), output, output if delivered is None else int(delivered),
            int(ledger_row["cost_micros"] or 0))


class Rollup:
    """Changes to `usage_daily` gathered over one batch, written with `write`."""

    def __init__(self):
        self._deltas: dict[tuple, list[int]] = {}
        self._shrunk: set[tuple] = set()  # keys a row left: emptied ones are deleted

    def _add(self, ledger_row: dict, sign: int) -> None:
        key = key_of(ledger_row)
        delta = self._deltas.setdefault(key, [0] * len(COUNTERS))
        for i, value in enumerate(contribution(ledger_row)):
            delta[i] += sign * value
        if sign < 0:
            self._shrunk.add(key)

    def change(self, before: dict | None, after: dict | None) -> None:
        """A ledger row went from `before` to `after` (None: it was not there, or is gone)."""
        if before is not None and after is not None and key_of(before) == key_of(after) \
                and contribution(before) == contribution(after):
            return
        if before is not None:
            self._add(before, -1)
        if after is not None:
            self._add(after, +1)

    def write(self, conn: Connection) -> None:
        rows = [{**dict(zip(KEY, key)), **dict(zip(COUNTERS, delta))}
                for key, delta in self._deltas.items() if any(delta)]
        add_to(conn, usage_daily, rows, COUNTERS)
        # A row that every ledger row left holds zeros: removed, so the table is the same as
        # one where the ledger rows were always at their final keys.
        shrunk = sorted(self._shrunk)
        c = usage_daily.c
        for start in range(0, len(shrunk), DELETE_CHUNK):
            chunk = shrunk[start:start + DELETE_CHUNK]
            conn.execute(usage_daily.delete().where(and_(
                tuple_(*(c[name] for name in KEY)).in_(chunk), c.generations == 0, c.batch_chunks == 0)))
        self._deltas.clear()
        self._shrunk.clear()
