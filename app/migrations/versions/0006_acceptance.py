"""acceptance evidence per node (V1)

Revision ID: 0006_acceptance
Revises: 0005_operator_sessions
Create Date: 2026-12-01 00:45:00.000000

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0006_acceptance'
down_revision = '0005_operator_sessions'
branch_labels = None
depends_on = None


def upgrade():
    pass


def downgrade():
    pass
