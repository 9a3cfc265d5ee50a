"""SQL tables. Every row here is a projection of the log (invariant 1): it can be dropped
and rebuilt by replay. Each projection's input positions live beside its rows.

Rows are built from event data only (no clock, no random ids), so a replay into an empty
database gives the same rows, and `pipelines.audit.digest` the same digest per table.
"""
from __future__ import annotations

from sqlalchemy import (
    BigInteger, Boolean, Column, DateTime, Float, Index, Integer, LargeBinary, MetaData, PrimaryKeyConstraint,
    String, Table, Text,
)

from models.limits import LIMITS

LIMIT_COLUMN_TYPES = {"int": Integer, "bigint": BigInteger, "float": Float, "bool": Boolean,
                      "name": lambda: String(64)}

metadata = MetaData(naming_convention={
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
})

# Where each projection has read up to, written in the same transaction as its rows.
checkpoints = Table(
    "projection_checkpoints", metadata,
    Column("projection", String(64), primary_key=True),
    Column("topic", String(200), primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("next_offset", BigInteger, nullable=False),
)

# Status of each generation, as the request, ledger and outcome events tell it. Keyed by
# tenant too: request ids come from clients, and two tenants may pick the same one.
# Columns other than the key are nullable because events of one request arrive on
# different topics, in any order during a replay.
generations = Table(
    "generations", metadata,
    Column("request_id", String(128), nullable=False),
    Column("tenant_id", String(64), nullable=False),
    Column("application_id", String(128)),
    Column("key_id", String(64)),
    Column("model_alias", String(128)),
    Column("model_revision", String(200)),
    Column("priority", String(16)),
    Column("status", String(32), nullable=False),
    Column("finish_reason", String(32)),
    Column("error_code", String(64)),  # failed: its code; cancelled: the reason
    Column("reject_reason", String(64)),
    Column("outcome", String(32)),  # what the first terminal event said; `status` prefers the settlement
    Column("reservation_id", String(64)),
    Column("reserved_tokens", BigInteger),
    Column("reserved_cost_micros", BigInteger),
    Column("input_tokens", Integer, nullable=False, default=0),  # charged: 0 where the engine never ran it
    # The prompt's tokens as requested, whatever ran: its workload class (models.prompt_class).
    # NULL: the request is not projected yet, or its row predates the column and ran nothing.
    Column("prompt_tokens", Integer),
    Column("output_tokens", Integer, nullable=False, default=0),
    # Of the output tokens, those its client received where it went away early (NULL: all).
    Column("delivered_output_tokens", Integer),
    Column("cache_entry_id", String(40)),  # answered from this semantic cache entry; NULL: an engine ran it
    Column("route_rule", String(64)),  # the router rule that chose its revision; NULL: the alias had no router
    Column("fallback_from", String(200)),  # the revision it fell back from (the overload ladder)
    Column("cost_micros", BigInteger, nullable=False, default=0),
    Column("queued_ms", Integer),
    Column("ttft_ms", Integer),
    Column("duration_ms", Integer),
    Column("settled", Boolean, nullable=False, default=False),
    Column("created_at", DateTime(timezone=True)),
    Column("started_at", DateTime(timezone=True)),
    Column("ended_at", DateTime(timezone=True)),
    Column("settled_at", DateTime(timezone=True)),
    PrimaryKeyConstraint("tenant_id", "request_id"),
    # The console's newest-first pages: a keyset walk per tenant, and over every tenant.
    Index("ix_generations_tenant_created", "tenant_id", "created_at", "request_id"),
    Index("ix_generations_created", "created_at"),
)

# Offline jobs: one row per batch, its header and lifecycle status (OpenAI's states).
# Token and cost totals are summed from `batch_chunks` or `usage_ledger` when read.
batches = Table(
    "batches", metadata,
    Column("tenant_id", String(64), nullable=False),
    Column("batch_id", String(128), nullable=False),
    Column("application_id", String(128)),
    Column("key_id", String(64)),
    Column("model_alias", String(128)),
    Column("model_revision", String(200)),
    Column("status", String(32), nullable=False),
    Column("request_count", Integer),
    Column("chunk_count", Integer),
    Column("created_at", DateTime(timezone=True)),
    Column("ended_at", DateTime(timezone=True)),
    PrimaryKeyConstraint("tenant_id", "batch_id"),
)

# Chunks of a batch: what ran, what it used, and whether its budget is settled.
batch_chunks = Table(
    "batch_chunks", metadata,
    Column("tenant_id", String(64), nullable=False),
    Column("batch_id", String(128), nullable=False),
    Column("chunk_index", Integer, nullable=False),
    Column("status", String(32), nullable=False),
    Column("reservation_id", String(64)),
    Column("reserved_tokens", BigInteger),
    Column("reserved_cost_micros", BigInteger),
    Column("attempts", Integer, nullable=False, default=0),
    Column("completed", Integer),
    Column("failed", Integer),
    Column("input_tokens", BigInteger, nullable=False, default=0),
    Column("output_tokens", BigInteger, nullable=False, default=0),
    Column("cost_micros", BigInteger, nullable=False, default=0),
    Column("model_revision", String(200)),
    Column("duration_ms", Integer),
    Column("error_code", String(64)),
    Column("settled", Boolean, nullable=False, default=False),
    Column("ended_at", DateTime(timezone=True)),
    Column("settled_at", DateTime(timezone=True)),
    PrimaryKeyConstraint("tenant_id", "batch_id", "chunk_index"),
)

# The usage ledger: one row per settled generation (source 'generation', source_id the
# request id) or completed batch chunk (source 'batch_chunk', '<batch_id>:<chunk>').
usage_ledger = Table(
    "usage_ledger", metadata,
    Column("tenant_id", String(64), nullable=False),
    Column("source", String(16), nullable=False),
    Column("source_id", String(200), nullable=False),
    Column("batch_id", String(128)),
    Column("application_id", String(128)),
    Column("key_id", String(64)),
    Column("model_alias", String(128)),
    Column("model_revision", String(200)),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),  # generated, and charged
    Column("cost_micros", BigInteger, nullable=False),
    Column("delivered_output_tokens", BigInteger),  # NULL: all of the output reached the client
    Column("cached", Boolean),  # answered from the semantic cache (NULL: no)
    Column("queued_ms", Integer),
    Column("ttft_ms", Integer),
    Column("duration_ms", Integer),
    Column("finish_reason", String(32)),
    Column("terminal_status", String(32), nullable=False),
    Column("settled_at", DateTime(timezone=True), nullable=False),
    Column("day", String(10), nullable=False),  # UTC date of settled_at: grouping without dialect date functions
    PrimaryKeyConstraint("tenant_id", "source", "source_id"),
    Index("ix_usage_ledger_tenant_day", "tenant_id", "day"),
    Index("ix_usage_ledger_day", "day"),
)

# The usage ledger summed per (tenant, day, application, key, revision), kept by the same
# projections in the same transaction as the ledger rows, so reads over months of usage
# never scan the ledger. A dimension the ledger row lacks is '' here (keys are NOT NULL).
# Equal, to the micro-unit, to the ledger's own sums over the same rows.
usage_daily = Table(
    "usage_daily", metadata,
    Column("tenant_id", String(64), nullable=False),
    Column("day", String(10), nullable=False),
    Column("application_id", String(128), nullable=False),
    Column("key_id", String(64), nullable=False),
    Column("model_revision", String(200), nullable=False),
    Column("generations", BigInteger, nullable=False),
    Column("batch_chunks", BigInteger, nullable=False),
    Column("cached", BigInteger, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("delivered_output_tokens", BigInteger, nullable=False),  # the ledger's, NULL counted as all output
    Column("cost_micros", BigInteger, nullable=False),
    PrimaryKeyConstraint("tenant_id", "day", "application_id", "key_id", "model_revision"),
    Index("ix_usage_daily_day", "day"),
)

# Quotas read model: the limits in force, settled usage per minute, open reservations.
tenant_limits = Table(
    "tenant_limits", metadata,
    Column("tenant_id", String(64), primary_key=True),
    # A column per limit of the catalogue (`models.limits`), as in force: a limit's default
    # where the events gave none (a new limit's column comes with a migration).
    *(Column(spec.name, LIMIT_COLUMN_TYPES[spec.column_type]()) for spec in LIMITS),
    Column("changed_at", DateTime(timezone=True), nullable=False),
    Column("changed_by", String(200)),
    # The columns above are in force: the operator's grant (canonical JSON of its limits)
    # tightened by the tenant admin's own limits (JSON; NULL: none). NULL grant: the row
    # predates own limits, and its columns are the grant.
    Column("granted", Text),
    Column("own_limits", Text),
)

quota_usage = Table(
    "quota_usage", metadata,
    Column("tenant_id", String(64), nullable=False),
    Column("minute", DateTime(timezone=True), nullable=False),
    Column("requests", Integer, nullable=False, default=0),
    Column("tokens", BigInteger, nullable=False, default=0),
    Column("cost_micros", BigInteger, nullable=False, default=0),
    PrimaryKeyConstraint("tenant_id", "minute"),
)

open_reservations = Table(
    "open_reservations", metadata,
    Column("tenant_id", String(64), nullable=False),
    Column("request_id", String(128), nullable=False),
    Column("reservation_id", String(64), nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("cost_micros", BigInteger, nullable=False),
    Column("reserved_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("tenant_id", "request_id"),
)

# Who changed what: one row per event on the admin topic, in log order.
admin_changes = Table(
    "admin_changes", metadata,
    Column("offset", BigInteger, primary_key=True),
    Column("event_id", String(36), nullable=False),
    Column("event_type", String(64), nullable=False),
    Column("occurred_at", DateTime(timezone=True), nullable=False),
    Column("actor", String(200)),
    Column("tenant_id", String(64), nullable=False, index=True),
    Column("subject", String(200)),
    Column("details", Text, nullable=False),  # canonical JSON of the payload, secrets' hashes left out
)

# The audit trail: every record of every durable topic, hashed into a chain per
# topic-partition: link = sha256(previous link + sha256(record value)).
audit_trail = Table(
    "audit_trail", metadata,
    Column("topic", String(200), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("seq", BigInteger, nullable=False),  # 1-based position in the chain (Kafka offsets may skip)
    Column("event_hash", LargeBinary(32), nullable=False),
    Column("link", LargeBinary(32), nullable=False),
    Column("event_id", String(36)),
    Column("event_type", String(64)),
    Column("tenant_id", String(64)),
    Column("correlation_id", String(200)),
    Column("occurred_at", DateTime(timezone=True)),
    # The record value as stored, which `event_hash` hashes: an auditor can check a row
    # alone. NULL for text-bearing types, should one ever reach a durable topic.
    Column("event", Text),
    PrimaryKeyConstraint("topic", "partition", "offset"),
    Index("ix_audit_trail_occurred_at", "occurred_at"),
    Index("ix_audit_trail_tenant_occurred", "tenant_id", "occurred_at"),
)


def _signed_head() -> list[Column]:
    """A chain head of one partition and its signature (new Column objects per table)."""
    return [
        Column("topic", String(200), nullable=False),
        Column("partition", Integer, nullable=False),
        Column("seq", BigInteger, nullable=False),
        Column("offset", BigInteger, nullable=False),
        Column("link", LargeBinary(32), nullable=False),
        Column("key_id", String(32), nullable=False),
        Column("signature", String(200), nullable=False),
    ]


# Signed chain heads, one every N records of a partition.
audit_checkpoints = Table(
    "audit_checkpoints", metadata,
    *_signed_head(),
    PrimaryKeyConstraint("topic", "partition", "seq"),
)

# Chain heads signed on time (`pipelines.audit.seal`): at least every minute while records
# arrive, and when the projector stops, so a trail never ends in a long unsigned tail.
# Not a projection (when they are made depends on the wall clock, not the log), so a replay
# neither makes nor compares them; `audit verify` checks them as it checks checkpoints.
audit_seals = Table(
    "audit_seals", metadata,
    *_signed_head(),
    Column("sealed_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("topic", "partition", "seq"),
)

PROJECTED_TABLES = (generations, batches, batch_chunks, usage_ledger, usage_daily, tenant_limits, quota_usage,
                    open_reservations, admin_changes, audit_trail, audit_checkpoints)
