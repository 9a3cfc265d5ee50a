"""usage_daily: the usage ledger summed per tenant, day, application, key and revision (the
console's reads), filled from the ledger already there; the generations' newest-first index

Revision ID: 0009
Revises: 0008
"""
from alembic import op
import sqlalchemy as sa

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'usage_daily',
        sa.Column('tenant_id', sa.String(64), nullable=False),
        sa.Column('day', sa.String(10), nullable=False),
        sa.Column('application_id', sa.String(128), nullable=False),
        sa.Column('key_id', sa.String(64), nullable=False),
        sa.Column('model_revision', sa.String(200), nullable=False),
        sa.Column('generations', sa.BigInteger(), nullable=False),
        sa.Column('batch_chunks', sa.BigInteger(), nullable=False),
        sa.Column('cached', sa.BigInteger(), nullable=False),
        sa.Column('input_tokens', sa.BigInteger(), nullable=False),
        sa.Column('output_tokens', sa.BigInteger(), nullable=False),
        sa.Column('delivered_output_tokens', sa.BigInteger(), nullable=False),
        sa.Column('cost_micros', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('tenant_id', 'day', 'application_id', 'key_id', 'model_revision',
                                name=op.f('pk_usage_daily')),
    )
    op.create_index('ix_usage_daily_day', 'usage_daily', ['day'])
    op.create_index('ix_generations_tenant_created', 'generations', ['tenant_id', 'created_at', 'request_id'])
    op.create_index('ix_generations_created', 'generations', ['created_at'])
    # The ledger so far, summed as the projections will keep summing it.
    op.execute(sa.text(
        "INSERT INTO usage_daily (tenant_id, day, application_id, key_id, model_revision, generations, batch_chunks, "
        "cached, input_tokens, output_tokens, delivered_output_tokens, cost_micros) "
        "SELECT tenant_id, day, COALESCE(application_id, ''), COALESCE(key_id, ''), COALESCE(model_revision, ''), "
        "SUM(CASE WHEN source = 'generation' THEN 1 ELSE 0 END), SUM(CASE WHEN source = 'batch_chunk' THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN cached THEN 1 ELSE 0 END), SUM(input_tokens), SUM(output_tokens), "
        "SUM(COALESCE(delivered_output_tokens, output_tokens)), SUM(cost_micros) FROM usage_ledger "
        "GROUP BY tenant_id, day, COALESCE(application_id, ''), COALESCE(key_id, ''), COALESCE(model_revision, '')"))


def downgrade() -> None:
    op.drop_index('ix_generations_created', table_name='generations')
    op.drop_index('ix_generations_tenant_created', table_name='generations')
    op.drop_index('ix_usage_daily_day', table_name='usage_daily')
    op.drop_table('usage_daily')
