"""tenant limits: batch tokens per window and dedicated pool

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tenant_limits') as batch:
        batch.add_column(sa.Column('batch_tokens_per_window', sa.BigInteger()))
        batch.add_column(sa.Column('pool', sa.String(64)))
    # Rebuild the quotas projection from the log so the new columns are filled, and so
    # its request counts follow the new rule (reservations, as admission counts them).
    for table in ('tenant_limits', 'quota_usage', 'open_reservations'):
        op.execute(sa.text(f"DELETE FROM {table}"))
    op.execute(sa.text("DELETE FROM projection_checkpoints WHERE projection = 'quotas'"))


def downgrade() -> None:
    with op.batch_alter_table('tenant_limits') as batch:
        batch.drop_column('pool')
        batch.drop_column('batch_tokens_per_window')
