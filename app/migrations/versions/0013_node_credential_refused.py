"""nodes remember when an agent reporting their GPUs presented an unknown credential (issue 22)

Revision ID: 0013_node_credential_refused
Revises: 0012_sweep_heard_since
Create Date: 2026-12-01 03:00:00.000000

After a restore from a backup older than a node's re-enrolment or credential rotation, its
agent holds a credential the restored database never saw: it gets 401 and exits 5. The console
shows that case from this time (never the presented secret: app.api.auth.note_refused_credential).
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0013_node_credential_refused'
down_revision = '0012_sweep_heard_since'
branch_labels = None
depends_on = None


def upgrade():
    # Plain ALTER TABLE on both databases: a batch rebuild of `nodes` on SQLite would drop the old
    # table, and with it (ON DELETE CASCADE) every lease, credential and GPU row.
    op.add_column('nodes', sa.Column('credential_refused_at', sa.DateTime(timezone=True), nullable=True))
    # Which node a refused agent's GPU UUIDs belong to, found by index: that lookup runs for
    # requests nobody authenticated, so it must never scan.
    op.create_index('ix_gpus_uuid', 'gpus', ['uuid'])


def downgrade():
    op.drop_index('ix_gpus_uuid', table_name='gpus')
    # SQLite 3.35+ drops a plain column in place (no rebuild, so no cascade; see upgrade).
    op.execute('ALTER TABLE nodes DROP COLUMN credential_refused_at')
