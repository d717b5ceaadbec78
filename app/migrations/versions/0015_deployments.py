"""deployments: a model kept loaded on a node under a client-facing name (S2, issue 23)

Revision ID: 0015_deployments
Revises: 0014_api_keys
Create Date: 2026-12-02 10:00:00.000000

A name is unique among the deployments that are not stopped (a partial unique index, on SQLite and
PostgreSQL alike), so a stopped deployment's name is free again; `node_leases.deployments_version`
is the heartbeat's `deployments_etag`, as `storage_roots_version` is the roots' (J1).
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0015_deployments'
down_revision = '0014_api_keys'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('deployments',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('node_id', sa.String(length=36), nullable=False),
    sa.Column('artifact_id', sa.String(length=36), nullable=False),
    sa.Column('model_file', sa.String(length=1000), nullable=False),
    sa.Column('tier', sa.String(length=16), nullable=False),
    sa.Column('context_length', sa.Integer(), nullable=True),
    sa.Column('n_gpu_layers', sa.Integer(), nullable=True),
    sa.Column('idle_unload_seconds', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('error_code', sa.String(length=64), nullable=True),
    sa.Column('error_message', sa.String(length=1000), nullable=True),
    sa.Column('error_next_step', sa.String(length=500), nullable=True),
    sa.Column('measured', sa.JSON(), nullable=True),
    sa.Column('placement', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ready_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_request_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['artifact_id'], ['artifacts.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('deployments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_deployments_artifact_id'), ['artifact_id'], unique=False)
        batch_op.create_index('ix_deployments_node_state', ['node_id', 'state'], unique=False)
        batch_op.create_index('uq_deployments_live_name', ['name'], unique=True,
                              sqlite_where=sa.text("state != 'stopped'"),
                              postgresql_where=sa.text("state != 'stopped'"))

    with op.batch_alter_table('node_leases', schema=None) as batch_op:
        batch_op.add_column(sa.Column('deployments_version', sa.Integer(), server_default='0', nullable=False))


def downgrade():
    with op.batch_alter_table('node_leases', schema=None) as batch_op:
        batch_op.drop_column('deployments_version')

    with op.batch_alter_table('deployments', schema=None) as batch_op:
        batch_op.drop_index('uq_deployments_live_name', sqlite_where=sa.text("state != 'stopped'"),
                            postgresql_where=sa.text("state != 'stopped'"))
        batch_op.drop_index('ix_deployments_node_state')
        batch_op.drop_index(batch_op.f('ix_deployments_artifact_id'))

    op.drop_table('deployments')
