"""storage_roots.observed_problem: why the agent refuses a root (J1, issue 25)

Revision ID: 0020_storage_root_problem
Revises: 0019_alert_targets
Create Date: 2026-12-03 06:10:00.000000

The agent creates a missing root directory when it may, and otherwise reports why it cannot use
the root ("parent not writable", "is a symlink", "outside the artifact directory"); null while it
can, or before it reports.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0020_storage_root_problem'
down_revision = '0019_alert_targets'
branch_labels = None
depends_on = None


def upgrade():
    # Plain ALTER TABLE on both databases, as 0013 and 0017 (no batch rebuild on SQLite).
    op.add_column('storage_roots', sa.Column('observed_problem', sa.String(length=500), nullable=True))


def downgrade():
    op.execute('ALTER TABLE storage_roots DROP COLUMN observed_problem')
