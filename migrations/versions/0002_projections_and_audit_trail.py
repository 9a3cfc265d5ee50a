"""projections and audit trail

The `generations` table is rebuilt rather than altered: it becomes keyed by (tenant,
request) and most columns become nullable (a replay may see a request's settlement
before its request event). It is a projection, so its rows come back by replay; its
checkpoints are dropped with it so the runner does exactly that.

Revision ID: 0002
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def _generations_v2() -> None:
    op.create_table(
        'generations',
        sa.Column('request_id', sa.String(128), nullable=False),
        sa.Column('tenant_id', sa.String(64), nullable=False),
        sa.Column('application_id', sa.String(128)),
        sa.Column('key_id', sa.String(64)),
        sa.Column('model_alias', sa.String(128)),
        sa.Column('model_revision', sa.String(200)),
        sa.Column('priority', sa.String(16)),
        sa.Column('status', sa.String(32), nullable=False),
        sa.Column('finish_reason', sa.String(32)),
        sa.Column('error_code', sa.String(64)),
        sa.Column('reject_reason', sa.String(64)),
        sa.Column('outcome', sa.String(32)),
        sa.Column('reservation_id', sa.String(64)),
        sa.Column('reserved_tokens', sa.BigInteger()),
        sa.Column('reserved_cost_micros', sa.BigInteger()),
        sa.Column('input_tokens', sa.Integer(), nullable=False),
        sa.Column('output_tokens', sa.Integer(), nullable=False),
        sa.Column('cost_micros', sa.BigInteger(), nullable=False),
        sa.Column('queued_ms', sa.Integer()),
        sa.Column('ttft_ms', sa.Integer()),
        sa.Column('duration_ms', sa.Integer()),
        sa.Column('settled', sa.Boolean(), nullable=False),
        sa.Column('created_at', TZ),
        sa.Column('started_at', TZ),
        sa.Column('ended_at', TZ),
        sa.Column('settled_at', TZ),
        sa.PrimaryKeyConstraint('tenant_id', 'request_id', name=op.f('pk_generations')),
    )


def _generations_v1() -> None:
    op.create_table(
        'generations',
        sa.Column('request_id', sa.String(128), nullable=False),
        sa.Column('tenant_id', sa.String(64), nullable=False),
        sa.Column('application_id', sa.String(128), nullable=False),
        sa.Column('model_alias', sa.String(128), nullable=False),
        sa.Column('model_revision', sa.String(200), nullable=False),
        sa.Column('status', sa.String(32), nullable=False),
        sa.Column('finish_reason', sa.String(32)),
        sa.Column('input_tokens', sa.Integer(), nullable=False),
        sa.Column('output_tokens', sa.Integer(), nullable=False),
        sa.Column('cost_micros', sa.BigInteger(), nullable=False),
        sa.Column('queued_ms', sa.Integer()),
        sa.Column('ttft_ms', sa.Integer()),
        sa.Column('duration_ms', sa.Integer()),
        sa.Column('created_at', TZ, nullable=False),
        sa.Column('ended_at', TZ),
        sa.PrimaryKeyConstraint('request_id', name=op.f('pk_generations')),
    )
    op.create_index(op.f('ix_generations_tenant_id'), 'generations', ['tenant_id'])


def _reset(projection: str) -> None:
    op.execute(sa.text("DELETE FROM projection_checkpoints WHERE projection = :p").bindparams(p=projection))


def upgrade() -> None:
    op.drop_index(op.f('ix_generations_tenant_id'), table_name='generations')
    op.drop_table('generations')
    _generations_v2()
    _reset('generations')
    _batches_and_usage()
    _quotas()
    _admin_changes()
    _audit_trail()


def _batches_and_usage() -> None:
    op.create_table(
        'batches',
        sa.Column('tenant_id', sa.String(64), nullable=False),
        sa.Column('batch_id', sa.String(128), nullable=False),
        sa.Column('application_id', sa.String(128)),
        sa.Column('key_id', sa.String(64)),
        sa.Column('model_alias', sa.String(128)),
        sa.Column('model_revision', sa.String(200)),
        sa.Column('status', sa.String(32), nullable=False),
        sa.Column('request_count', sa.Integer()),
        sa.Column('chunk_count', sa.Integer()),
        sa.Column('created_at', TZ),
        sa.Column('ended_at', TZ),
        sa.PrimaryKeyConstraint('tenant_id', 'batch_id', name=op.f('pk_batches')),
    )
    op.create_table(
        'usage_ledger',
        sa.Column('tenant_id', sa.String(64), nullable=False),
        sa.Column('source', sa.String(16), nullable=False),
        sa.Column('source_id', sa.String(200), nullable=False),
        sa.Column('batch_id', sa.String(128)),
        sa.Column('application_id', sa.String(128)),
        sa.Column('key_id', sa.String(64)),
        sa.Column('model_alias', sa.String(128)),
        sa.Column('model_revision', sa.String(200)),
        sa.Column('input_tokens', sa.BigInteger(), nullable=False),
        sa.Column('output_tokens', sa.BigInteger(), nullable=False),
        sa.Column('cost_micros', sa.BigInteger(), nullable=False),
        sa.Column('queued_ms', sa.Integer()),
        sa.Column('ttft_ms', sa.Integer()),
        sa.Column('duration_ms', sa.Integer()),
        sa.Column('finish_reason', sa.String(32)),
        sa.Column('terminal_status', sa.String(32), nullable=False),
        sa.Column('settled_at', TZ, nullable=False),
        sa.Column('day', sa.String(10), nullable=False),
        sa.PrimaryKeyConstraint('tenant_id', 'source', 'source_id', name=op.f('pk_usage_ledger')),
    )
    op.create_index('ix_usage_ledger_tenant_day', 'usage_ledger', ['tenant_id', 'day'])
    op.create_index('ix_usage_ledger_day', 'usage_ledger', ['day'])


def _quotas() -> None:
    op.create_table(
        'tenant_limits',
        sa.Column('tenant_id', sa.String(64), nullable=False),
        sa.Column('requests_per_minute', sa.Integer()),
        sa.Column('max_concurrent', sa.Integer()),
        sa.Column('tokens_per_window', sa.BigInteger()),
        sa.Column('spend_per_window_micros', sa.BigInteger()),
        sa.Column('window_seconds', sa.Integer()),
        sa.Column('max_input_tokens', sa.Integer()),
        sa.Column('max_output_tokens', sa.Integer()),
        sa.Column('changed_at', TZ, nullable=False),
        sa.Column('changed_by', sa.String(200)),
        sa.PrimaryKeyConstraint('tenant_id', name=op.f('pk_tenant_limits')),
    )
    op.create_table(
        'quota_usage',
        sa.Column('tenant_id', sa.String(64), nullable=False),
        sa.Column('minute', TZ, nullable=False),
        sa.Column('requests', sa.Integer(), nullable=False),
        sa.Column('tokens', sa.BigInteger(), nullable=False),
        sa.Column('cost_micros', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('tenant_id', 'minute', name=op.f('pk_quota_usage')),
    )
    op.create_table(
        'open_reservations',
        sa.Column('tenant_id', sa.String(64), nullable=False),
        sa.Column('request_id', sa.String(128), nullable=False),
        sa.Column('reservation_id', sa.String(64), nullable=False),
        sa.Column('tokens', sa.BigInteger(), nullable=False),
        sa.Column('cost_micros', sa.BigInteger(), nullable=False),
        sa.Column('reserved_at', TZ, nullable=False),
        sa.PrimaryKeyConstraint('tenant_id', 'request_id', name=op.f('pk_open_reservations')),
    )


def _admin_changes() -> None:
    op.create_table(
        'admin_changes',
        sa.Column('offset', sa.BigInteger(), nullable=False),
        sa.Column('event_id', sa.String(36), nullable=False),
        sa.Column('event_type', sa.String(64), nullable=False),
        sa.Column('occurred_at', TZ, nullable=False),
        sa.Column('actor', sa.String(200)),
        sa.Column('tenant_id', sa.String(64), nullable=False),
        sa.Column('subject', sa.String(200)),
        sa.Column('details', sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint('offset', name=op.f('pk_admin_changes')),
    )
    op.create_index(op.f('ix_admin_changes_tenant_id'), 'admin_changes', ['tenant_id'])


def _audit_trail() -> None:
    op.create_table(
        'audit_trail',
        sa.Column('topic', sa.String(200), nullable=False),
        sa.Column('partition', sa.Integer(), nullable=False),
        sa.Column('offset', sa.BigInteger(), nullable=False),
        sa.Column('seq', sa.BigInteger(), nullable=False),
        sa.Column('event_hash', sa.LargeBinary(32), nullable=False),
        sa.Column('link', sa.LargeBinary(32), nullable=False),
        sa.Column('event_id', sa.String(36)),
        sa.Column('event_type', sa.String(64)),
        sa.Column('tenant_id', sa.String(64)),
        sa.Column('correlation_id', sa.String(200)),
        sa.Column('occurred_at', TZ),
        sa.Column('event', sa.Text()),
        sa.PrimaryKeyConstraint('topic', 'partition', 'offset', name=op.f('pk_audit_trail')),
    )
    op.create_index('ix_audit_trail_occurred_at', 'audit_trail', ['occurred_at'])
    op.create_index('ix_audit_trail_tenant_occurred', 'audit_trail', ['tenant_id', 'occurred_at'])
    op.create_table(
        'audit_checkpoints',
        sa.Column('topic', sa.String(200), nullable=False),
        sa.Column('partition', sa.Integer(), nullable=False),
        sa.Column('seq', sa.BigInteger(), nullable=False),
        sa.Column('offset', sa.BigInteger(), nullable=False),
        sa.Column('link', sa.LargeBinary(32), nullable=False),
        sa.Column('key_id', sa.String(32), nullable=False),
        sa.Column('signature', sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint('topic', 'partition', 'seq', name=op.f('pk_audit_checkpoints')),
    )


def downgrade() -> None:
    for table in ('audit_checkpoints', 'audit_trail', 'admin_changes', 'open_reservations', 'quota_usage',
                  'tenant_limits', 'usage_ledger', 'batches'):
        op.drop_table(table)
    for projection in ('audit', 'admin_history', 'quotas', 'batches'):
        _reset(projection)
    op.drop_table('generations')
    _generations_v1()
    _reset('generations')
