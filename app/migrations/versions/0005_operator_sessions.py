"""operator sessions that sign-out ends (C1, P2)

Revision ID: 0005_operator_sessions
Revises: 0004_runtime_worker
Create Date: 2026-11-30 21:55:00.000000

"""
from alembic import op
import sqlalchemy as sa



# revision identifiers, used by Alembic.
revision = '0005_operator_sessions'
down_revision = '0004_runtime_worker'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('operator_sessions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('remote_addr', sa.String(length=64), nullable=True),
    sa.Column('user_agent', sa.String(length=200), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('token_hash')
    )
    with op.batch_alter_table('operator_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_operator_sessions_expires_at'), ['expires_at'], unique=False)


def downgrade():
    with op.batch_alter_table('operator_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_operator_sessions_expires_at'))

    op.drop_table('operator_sessions')
