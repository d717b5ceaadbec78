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
    op.create_table('alert_deliveries',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('audit_event_id', sa.BigInteger(), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('target_key', sa.String(length=64), nullable=False),
    sa.Column('target_label', sa.String(length=300), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_error', sa.String(length=500), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('sent_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('audit_event_id', 'target_key', name='uq_alert_deliveries_event_target')
    )
    with op.batch_alter_table('alert_deliveries', schema=None) as batch_op:
        batch_op.create_index('ix_alert_deliveries_state_next_attempt', ['state', 'next_attempt_at'], unique=False)
        batch_op.create_index('ix_alert_deliveries_target_attempted', ['target_key', 'last_attempt_at'], unique=False)

    op.create_table('alert_cursor',
    sa.Column('name', sa.String(length=32), nullable=False),
    sa.Column('last_audit_event_id', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )


def downgrade():
    op.drop_table('alert_cursor')
    with op.batch_alter_table('alert_deliveries', schema=None) as batch_op:
        batch_op.drop_index('ix_alert_deliveries_target_attempted')
        batch_op.drop_index('ix_alert_deliveries_state_next_attempt')

    op.drop_table('alert_deliveries')
