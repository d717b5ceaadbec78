"""alert deliveries sent once per transition (O2)

Revision ID: 0007_alerts
Revises: 0006_acceptance
Create Date: 2026-12-01 00:45:00.000000

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0007_alerts'
down_revision = '0006_acceptance'
branch_labels = None
depends_on = None


def upgrade():
    pass


def downgrade():
    pass
