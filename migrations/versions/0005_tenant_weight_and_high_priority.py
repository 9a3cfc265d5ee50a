"""tenant limits: fair-share weight and the right to send priority high

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tenant_limits') as batch:
        batch.add_column(sa.Column('fair_share_weight', sa.Float()))
        batch.add_column(sa.Column('may_send_high', sa.Boolean()))
    # No event before this revision names either, so the rows a replay would build hold the
    # defaults: fill them in place instead of rebuilding the projection from the log.
    op.execute(sa.text("UPDATE tenant_limits SET fair_share_weight = 1.0, may_send_high = false"))


def downgrade() -> None:
    with op.batch_alter_table('tenant_limits') as batch:
        batch.drop_column('may_send_high')
        batch.drop_column('fair_share_weight')
