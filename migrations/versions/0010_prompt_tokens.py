"""generations: the prompt's tokens as requested, which its workload class is judged by
(the charged input tokens are 0 for a request that never ran)

Revision ID: 0010
Revises: 0009
"""
from alembic import op
import sqlalchemy as sa

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('generations') as batch:
        batch.add_column(sa.Column('prompt_tokens', sa.Integer()))
    # Where an older row charged input tokens, they are the request's own (the engine ran its
    # whole prompt); where it charged none, the length is unknown and stays NULL.
    op.execute(sa.text("UPDATE generations SET prompt_tokens = input_tokens WHERE input_tokens > 0"))


def downgrade() -> None:
    with op.batch_alter_table('generations') as batch:
        batch.drop_column('prompt_tokens')
