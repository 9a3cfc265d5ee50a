"""generations and checkpoints

Revision ID: 0001
Revises: 
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    
    op.create_table('generations',
    sa.Column('request_id', sa.String(length=128), nullable=False),
    sa.Column('tenant_id', sa.String(length=64), nullable=False),
    sa.Column('application_id', sa.String(length=128), nullable=False),
    sa.Column('model_alias', sa.String(length=128), nullable=False),
    sa.Column('model_revision', sa.String(length=200), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('finish_reason', sa.String(length=32), nullable=True),
    sa.Column('input_tokens', sa.Integer(), nullable=False),
    sa.Column('output_tokens', sa.Integer(), nullable=False),
    sa.Column('cost_micros', sa.BigInteger(), nullable=False),
    sa.Column('queued_ms', sa.Integer(), nullable=True),
    sa.Column('ttft_ms', sa.Integer(), nullable=True),
    sa.Column('duration_ms', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('request_id', name=op.f('pk_generations'))
    )
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_generations_tenant_id'), ['tenant_id'], unique=False)

    op.create_table('projection_checkpoints',
    sa.Column('projection', sa.String(length=64), nullable=False),
    sa.Column('topic', sa.String(length=200), nullable=False),
    sa.Column('partition', sa.Integer(), nullable=False),
    sa.Column('next_offset', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('projection', 'topic', 'partition', name=op.f('pk_projection_checkpoints'))
    )
    


def downgrade() -> None:
    
    op.drop_table('projection_checkpoints')
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_generations_tenant_id'))

    op.drop_table('generations')
    
