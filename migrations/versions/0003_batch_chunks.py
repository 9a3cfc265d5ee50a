"""batch chunks

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'batch_chunks',
        sa.Column('tenant_id', sa.String(64), nullable=False),
        sa.Column('batch_id', sa.String(128), nullable=False),
        sa.Column('chunk_index', sa.Integer(), nullable=False),
        sa.Column('status', sa.String(32), nullable=False),
        sa.Column('reservation_id', sa.String(64)),
        sa.Column('reserved_tokens', sa.BigInteger()),
        sa.Column('reserved_cost_micros', sa.BigInteger()),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('completed', sa.Integer()),
        sa.Column('failed', sa.Integer()),
        sa.Column('input_tokens', sa.BigInteger(), nullable=False),
        sa.Column('output_tokens', sa.BigInteger(), nullable=False),
        sa.Column('cost_micros', sa.BigInteger(), nullable=False),
        sa.Column('model_revision', sa.String(200)),
        sa.Column('duration_ms', sa.Integer()),
        sa.Column('error_code', sa.String(64)),
        sa.Column('settled', sa.Boolean(), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True)),
        sa.Column('settled_at', sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint('tenant_id', 'batch_id', 'chunk_index', name=op.f('pk_batch_chunks')),
    )
    # The batches projection gains a table: rebuild it (and its ledger rows) from the log.
    op.execute(sa.text("DELETE FROM usage_ledger WHERE source = 'batch_chunk'"))
    op.execute(sa.text("DELETE FROM batches"))
    op.execute(sa.text("DELETE FROM projection_checkpoints WHERE projection = 'batches'"))


def downgrade() -> None:
    op.drop_table('batch_chunks')
