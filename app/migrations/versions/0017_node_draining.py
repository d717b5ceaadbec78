"""nodes.draining: a node that finishes what runs and takes no new job or deployment (S3, issue 24)

Revision ID: 0017_node_draining
Revises: 0016_deployment_served
Create Date: 2026-12-02 20:20:00.000000

`draining_at` says since when; both are cleared by undrain.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0017_node_draining'
down_revision = '0016_deployment_served'
branch_labels = None
depends_on = None


def upgrade():
    # Plain ALTER TABLE on both databases, as 0013: a batch rebuild of `nodes` on SQLite would drop
    # the old table, and with it (ON DELETE CASCADE) every lease, credential and GPU row.
    op.add_column('nodes', sa.Column('draining', sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column('nodes', sa.Column('draining_at', sa.DateTime(timezone=True), nullable=True))


def downgrade():
    # SQLite 3.35+ drops a plain column in place (no rebuild, so no cascade).
    op.execute('ALTER TABLE nodes DROP COLUMN draining_at')
    op.execute('ALTER TABLE nodes DROP COLUMN draining')
