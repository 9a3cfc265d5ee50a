"""generations answered from the semantic cache (the entry, and the usage row's mark), and
the router rule that chose a generation's revision and the revision it fell back from

Revision ID: 0008
Revises: 0007
"""
from alembic import op
import sqlalchemy as sa

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: an engine ran it, which is what every older row records.
    with op.batch_alter_table('generations') as batch:
        batch.add_column(sa.Column('cache_entry_id', sa.String(40)))
        batch.add_column(sa.Column('route_rule', sa.String(64)))
        batch.add_column(sa.Column('fallback_from', sa.String(200)))
    with op.batch_alter_table('usage_ledger') as batch:
        batch.add_column(sa.Column('cached', sa.Boolean()))


def downgrade() -> None:
    with op.batch_alter_table('usage_ledger') as batch:
        batch.drop_column('cached')
    with op.batch_alter_table('generations') as batch:
        batch.drop_column('fallback_from')
        batch.drop_column('route_rule')
        batch.drop_column('cache_entry_id')
