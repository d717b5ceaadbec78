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
    op.create_table('acceptance_evidence',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('node_id', sa.String(length=36), nullable=False),
    sa.Column('item', sa.String(length=32), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('observed_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('source', sa.String(length=100), nullable=False),
    sa.Column('detail', sa.String(length=1000), nullable=False),
    sa.Column('evidence', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('node_id', 'item', name='uq_acceptance_evidence_node_item')
    )
    with op.batch_alter_table('acceptance_evidence', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_acceptance_evidence_node_id'), ['node_id'], unique=False)

    op.create_table('acceptance_screenshots',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('node_id', sa.String(length=36), nullable=False),
    sa.Column('filename', sa.String(length=200), nullable=False),
    sa.Column('content_type', sa.String(length=32), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('width', sa.Integer(), nullable=False),
    sa.Column('height', sa.Integer(), nullable=False),
    sa.Column('uploaded_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('uploaded_by', sa.String(length=100), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('acceptance_screenshots', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_acceptance_screenshots_node_id'), ['node_id'], unique=False)


def downgrade():
    with op.batch_alter_table('acceptance_screenshots', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_acceptance_screenshots_node_id'))

    op.drop_table('acceptance_screenshots')
    with op.batch_alter_table('acceptance_evidence', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_acceptance_evidence_node_id'))

    op.drop_table('acceptance_evidence')
