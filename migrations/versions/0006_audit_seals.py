"""audit seals: chain heads signed on time and at the projector's shutdown

Revision ID: 0006
Revises: 0005
"""
from alembic import op
import sqlalchemy as sa

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'audit_seals',
        sa.Column('topic', sa.String(200), nullable=False),
        sa.Column('partition', sa.Integer(), nullable=False),
        sa.Column('seq', sa.BigInteger(), nullable=False),
        sa.Column('offset', sa.BigInteger(), nullable=False),
        sa.Column('link', sa.LargeBinary(32), nullable=False),
        sa.Column('key_id', sa.String(32), nullable=False),
        sa.Column('signature', sa.String(200), nullable=False),
        sa.Column('sealed_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('topic', 'partition', 'seq', name=op.f('pk_audit_seals')),
    )


def downgrade() -> None:
    op.drop_table('audit_seals')
