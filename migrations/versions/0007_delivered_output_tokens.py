"""usage: the output tokens a client received beside those generated (and charged);
tenant limits: the operator's grant and the tenant admin's own limits beside those in force

Revision ID: 0007
Revises: 0006
"""
from alembic import op
import sqlalchemy as sa

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL means all of the output reached the client, which is what every older row records.
    with op.batch_alter_table('generations') as batch:
        batch.add_column(sa.Column('delivered_output_tokens', sa.Integer()))
    with op.batch_alter_table('usage_ledger') as batch:
        batch.add_column(sa.Column('delivered_output_tokens', sa.BigInteger()))
    with op.batch_alter_table('tenant_limits') as batch:
        batch.add_column(sa.Column('granted', sa.Text()))
        batch.add_column(sa.Column('own_limits', sa.Text()))


def downgrade() -> None:
    with op.batch_alter_table('tenant_limits') as batch:
        batch.drop_column('own_limits')
        batch.drop_column('granted')
    with op.batch_alter_table('usage_ledger') as batch:
        batch.drop_column('delivered_output_tokens')
    with op.batch_alter_table('generations') as batch:
        batch.drop_column('delivered_output_tokens')
