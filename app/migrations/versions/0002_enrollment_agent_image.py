"""enrolments remember the agent image the console wizard gave commands for (C4, D5)

Revision ID: 0002_enrollment_agent_image
Revises: 0001_initial
Create Date: 2026-11-30 07:00:00

"""
from alembic import op
import sqlalchemy as sa


revision = '0002_enrollment_agent_image'
down_revision = '0001_initial'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('enrollments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('agent_image', sa.JSON(), nullable=True))


def downgrade():
    with op.batch_alter_table('enrollments', schema=None) as batch_op:
        batch_op.drop_column('agent_image')
