"""alert_targets: alert targets added in the console, their URLs Fernet-encrypted (O2, issue 25)

Revision ID: 0019_alert_targets
Revises: 0018_artifact_models
Create Date: 2026-12-03 06:00:00.000000

Until now every target came from MODELFORGE_ALERT_URLS; those still do. A row here holds a URL only
as a Fernet token (P2), the keyed digest that names it in alert_deliveries (unique: a URL is added
once) and its masked label.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0019_alert_targets'
down_revision = '0018_artifact_models'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('alert_targets',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('target_key', sa.String(length=64), nullable=False),
    sa.Column('label', sa.String(length=300), nullable=False),
    sa.Column('url_encrypted', sa.Text(), nullable=False),
    sa.Column('enabled', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('enabled_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('target_key', name='uq_alert_targets_target_key')
    )


def downgrade():
    op.drop_table('alert_targets')
