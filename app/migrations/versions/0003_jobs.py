"""storage roots, typed jobs under fenced leases, artifacts; leases remember capabilities (J1-J3)

Revision ID: 0003_jobs
Revises: 0002_enrollment_agent_image
Create Date: 2026-11-30 18:44:39.391808

"""
from alembic import op
import sqlalchemy as sa



# revision identifiers, used by Alembic.
revision = '0003_jobs'
down_revision = '0002_enrollment_agent_image'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('storage_roots',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('node_id', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('host_path', sa.String(length=1000), nullable=False),
    sa.Column('container_path', sa.String(length=1000), nullable=False),
    sa.Column('min_free_bytes', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('observed_exists', sa.Boolean(), nullable=True),
    sa.Column('observed_writable', sa.Boolean(), nullable=True),
    sa.Column('observed_free_bytes', sa.BigInteger(), nullable=True),
    sa.Column('observed_total_bytes', sa.BigInteger(), nullable=True),
    sa.Column('observed_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('node_id', 'name', name='uq_storage_roots_node_name')
    )
    with op.batch_alter_table('storage_roots', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_storage_roots_node_id'), ['node_id'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('type', sa.String(length=64), nullable=False),
    sa.Column('node_id', sa.String(length=36), nullable=False),
    sa.Column('storage_root_id', sa.String(length=36), nullable=True),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('progress', sa.JSON(), nullable=True),
    sa.Column('result', sa.JSON(), nullable=True),
    sa.Column('error', sa.JSON(), nullable=True),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('not_before', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['storage_root_id'], ['storage_roots.id'], ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index('ix_jobs_created', ['created_at', 'id'], unique=False)
        batch_op.create_index('ix_jobs_node_state', ['node_id', 'state'], unique=False)
        batch_op.create_index('ix_jobs_state_lease', ['state', 'lease_expires_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_storage_root_id'), ['storage_root_id'], unique=False)
        batch_op.create_index('uq_jobs_one_running_per_node', ['node_id'], unique=True, sqlite_where=sa.text("state = 'running'"), postgresql_where=sa.text("state = 'running'"))

    op.create_table('artifacts',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('node_id', sa.String(length=36), nullable=False),
    sa.Column('storage_root_id', sa.String(length=36), nullable=False),
    sa.Column('repo_id', sa.String(length=200), nullable=False),
    sa.Column('repo_type', sa.String(length=16), nullable=False),
    sa.Column('revision', sa.String(length=200), nullable=False),
    sa.Column('commit', sa.String(length=40), nullable=False),
    sa.Column('container_path', sa.String(length=2000), nullable=False),
    sa.Column('host_path', sa.String(length=2000), nullable=False),
    sa.Column('files', sa.Integer(), nullable=False),
    sa.Column('total_bytes', sa.BigInteger(), nullable=False),
    sa.Column('verified_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('job_id', sa.String(length=36), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['storage_root_id'], ['storage_roots.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('storage_root_id', 'repo_type', 'repo_id', 'commit', name='uq_artifacts_place')
    )
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_artifacts_node_id'), ['node_id'], unique=False)

    with op.batch_alter_table('node_leases', schema=None) as batch_op:
        batch_op.add_column(sa.Column('capabilities', sa.JSON(), server_default='[]', nullable=False))
        batch_op.add_column(sa.Column('storage_roots_version', sa.Integer(), server_default='0', nullable=False))



def downgrade():
    with op.batch_alter_table('node_leases', schema=None) as batch_op:
        batch_op.drop_column('storage_roots_version')
        batch_op.drop_column('capabilities')

    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_artifacts_node_id'))

    op.drop_table('artifacts')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('uq_jobs_one_running_per_node', sqlite_where=sa.text("state = 'running'"), postgresql_where=sa.text("state = 'running'"))
        batch_op.drop_index(batch_op.f('ix_jobs_storage_root_id'))
        batch_op.drop_index('ix_jobs_state_lease')
        batch_op.drop_index('ix_jobs_node_state')
        batch_op.drop_index('ix_jobs_created')

    op.drop_table('jobs')
    with op.batch_alter_table('storage_roots', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_storage_roots_node_id'))

    op.drop_table('storage_roots')
