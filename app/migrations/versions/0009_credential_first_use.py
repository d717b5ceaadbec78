"""credentials remember their enrolment and first use, so a lost enrol reply can be retried (E2)

Revision ID: 0009_credential_first_use
Revises: 0008_sweep_durations
Create Date: 2026-12-01 00:50:00.000000

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0009_credential_first_use'
down_revision = '0008_sweep_durations'
branch_labels = None
depends_on = None


def upgrade():
    # Credentials issued before this revision keep enrollment_id NULL: they are never reissued.
    with op.batch_alter_table('credentials', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                'enrollment_id',
                sa.String(length=36),
                sa.ForeignKey('enrollments.id', name='fk_credentials_enrollment_id', ondelete='SET NULL'),
                nullable=True,
            )
        )
        batch_op.add_column(sa.Column('first_used_at', sa.DateTime(timezone=True), nullable=True))


def downgrade():
    with op.batch_alter_table('credentials', schema=None) as batch_op:
        batch_op.drop_column('first_used_at')
        batch_op.drop_column('enrollment_id')
