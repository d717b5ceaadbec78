"""runtime jobs name their artifact; leases remember the runtime worker (W1, W2)

Revision ID: 0004_runtime_worker
Revises: 0003_jobs
Create Date: 2026-12-02 09:12:03.118204

"""
from contextlib import contextmanager

from alembic import op
import sqlalchemy as sa



# revision identifiers, used by Alembic.
revision = '0004_runtime_worker'
down_revision = '0003_jobs'
branch_labels = None
depends_on = None


@contextmanager
def _artifact_links_kept():
    """SQLite's batch mode copies `jobs` and drops the old table; with foreign keys on, that drop
    nulls every artifacts.job_id (ON DELETE SET NULL). The links are read first and put back."""
    bind = op.get_bind()
    links = []
    if bind.dialect.name == 'sqlite':
        links = bind.execute(sa.text('SELECT id, job_id FROM artifacts WHERE job_id IS NOT NULL')).all()
    yield
    if links:
        bind.execute(
            sa.text('UPDATE artifacts SET job_id = :job_id WHERE id = :id'),
            [{'id': artifact_id, 'job_id': job_id} for artifact_id, job_id in links],
        )


def upgrade():
    with _artifact_links_kept(), op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('artifact_id', sa.String(length=36), nullable=True))
        batch_op.create_index(batch_op.f('ix_jobs_artifact_id'), ['artifact_id'], unique=False)
        batch_op.create_foreign_key('fk_jobs_artifact_id_artifacts', 'artifacts', ['artifact_id'], ['id'], ondelete='SET NULL')

    with op.batch_alter_table('node_leases', schema=None) as batch_op:
        batch_op.add_column(sa.Column('runtime_worker', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('runtime_worker_problem', sa.String(length=500), nullable=True))
        batch_op.add_column(sa.Column('worker_compatibility', sa.String(length=16), nullable=True))


def downgrade():
    with op.batch_alter_table('node_leases', schema=None) as batch_op:
        batch_op.drop_column('worker_compatibility')
        batch_op.drop_column('runtime_worker_problem')
        batch_op.drop_column('runtime_worker')

    with _artifact_links_kept(), op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_constraint('fk_jobs_artifact_id_artifacts', type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_jobs_artifact_id'))
        batch_op.drop_column('artifact_id')
