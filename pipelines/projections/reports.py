"""Chargeback files from the usage ledger: CSV or Parquet, and a spend-per-day chart."""
from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

REPORT_COLUMNS = ("month", "tenant_id", "application_id", "model_alias", "model_revision", "generations",
                  "batch_chunks", "input_tokens", "output_tokens", "cost_micros")


def write_csv(rows: Sequence[dict[str, Any]], out: io.TextIOBase) -> None:
    writer = csv.DictWriter(out, fieldnames=REPORT_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)


def write_parquet(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(c, pa.string()) for c in REPORT_COLUMNS[:5]] + [(c, pa.int64()) for c in REPORT_COLUMNS[5:]])
    table = pa.Table.from_pylist([{c: row.get(c) for c in REPORT_COLUMNS} for row in rows], schema=schema)
    pq.write_table(table, path)


def plot_daily_spend(points: Sequence[tuple[str, str, int]], path: Path, *, title: str) -> None:
    """One line per tenant: spend (in currency units, from micros) per day."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt

    days = sorted({day for day, _, _ in points})
    spend: dict[str, dict[str, float]] = defaultdict(dict)
    for day, tenant, micros in points:
        spend[tenant][day] = micros / 1_000_000
    fig, ax = plt.subplots(figsize=(10, 5))
    for tenant in sorted(spend):
        ax.plot(days, [spend[tenant].get(day, 0.0) for day in days], marker="o", label=tenant)
    ax.set_title(title)
    ax.set_xlabel("day (UTC)")
    ax.set_ylabel("spend (price units, micros / 1e6)")
    ax.tick_params(axis="x", labelrotation=45)
    if spend:
        ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
