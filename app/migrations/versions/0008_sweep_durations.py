"""sweep durations for GET /metrics (O1)

Revision ID: 0008_sweep_durations
Revises: 0007_alerts
Create Date: 2026-12-01 00:50:00.000000

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0008_sweep_durations'
down_revision = '0007_alerts'
branch_labels = None
depends_on = None


def upgrade():
    # A database made by the first edition of 0001 has no sweep_ticks; 0011 creates it whole, with
    # these columns (issue 22). The only edit ever made to an applied migration; see
    # tests/unit/test_migrations.py.
    if 'sweep_ticks' not in sa.inspect(op.get_bind()).get_table_names():
        return
    with op.batch_alter_table('sweep_ticks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('last_duration_seconds', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('last_finished_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('duration_seconds_total', sa.Float(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('completed_runs', sa.BigInteger(), server_default='0', nullable=False))


def downgrade():
    with op.batch_alter_table('sweep_ticks', schema=None) as batch_op:
        batch_op.drop_column('completed_runs')
        batch_op.drop_column('duration_seconds_total')
        batch_op.drop_column('last_finished_at')
        batch_op.drop_column('last_duration_seconds')
