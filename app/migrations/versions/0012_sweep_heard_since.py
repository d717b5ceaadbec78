"""sweep_ticks.heard_since: silence during the control plane's own downtime is not judged (L1, J2)

Revision ID: 0012_sweep_heard_since
Revises: 0011_first_schema_repair
Create Date: 2026-12-02 03:00:00.000000

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0012_sweep_heard_since'
down_revision = '0011_first_schema_repair'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('sweep_ticks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('heard_since', sa.DateTime(timezone=True), nullable=True))


def downgrade():
    with op.batch_alter_table('sweep_ticks', schema=None) as batch_op:
        batch_op.drop_column('heard_since')
