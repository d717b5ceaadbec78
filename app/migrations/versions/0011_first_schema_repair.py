"""repair databases made by an earlier edition of 0001 (issue 22)

0001_initial was edited in place three times after databases existed at it (commits ec8fcc1,
ab11d5a, f1bc0c5), so a database stamped 0001_initial may have the first edition's schema: no
sweep_ticks, no telemetry_rollups, telemetry_samples keyed by (node_id, gpu_uuid) with datetimes,
and two single-column lease indexes. 0008 skips sweep_ticks when it is missing; this revision
brings every such object to what 0001..0010 make today, and does nothing on a database that
already has it. Samples are kept: each is moved to its GPU's row and epoch milliseconds.

Revision ID: 0011_first_schema_repair
Revises: 0010_unvalidated_not_eligible
Create Date: 2026-12-02 03:00:00.000000

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0011_first_schema_repair'
down_revision = '0010_unvalidated_not_eligible'
branch_labels = None
depends_on = None


def _inspector():
    return sa.inspect(op.get_bind())


def _create_sweep_ticks():
    op.create_table('sweep_ticks',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('last_tick', sa.BigInteger(), nullable=False),
    sa.Column('holder', sa.String(length=200), nullable=True),
    sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('runs', sa.BigInteger(), nullable=False),
    sa.Column('last_duration_seconds', sa.Float(), nullable=True),
    sa.Column('last_finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('duration_seconds_total', sa.Float(), server_default='0', nullable=False),
    sa.Column('completed_runs', sa.BigInteger(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('name')
    )


def _create_telemetry_rollups():
    op.create_table('telemetry_rollups',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('bucket_start', sa.BigInteger(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('utilization_sum', sa.Float(), nullable=True),
    sa.Column('utilization_count', sa.Integer(), nullable=False),
    sa.Column('utilization_max', sa.Float(), nullable=True),
    sa.Column('memory_used_sum', sa.Float(), nullable=True),
    sa.Column('memory_used_count', sa.Integer(), nullable=False),
    sa.Column('memory_used_max', sa.BigInteger(), nullable=True),
    sa.Column('temperature_sum', sa.Float(), nullable=True),
    sa.Column('temperature_count', sa.Integer(), nullable=False),
    sa.Column('temperature_max', sa.Float(), nullable=True),
    sa.Column('power_sum', sa.Float(), nullable=True),
    sa.Column('power_count', sa.Integer(), nullable=False),
    sa.Column('power_max', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('telemetry_rollups', schema=None) as batch_op:
        batch_op.create_index('ix_telemetry_rollups_bucket', ['bucket_start'], unique=False)
        batch_op.create_index('ix_telemetry_rollups_gpu_bucket', ['gpu_id', 'bucket_start'], unique=False)


def _create_telemetry_samples():
    op.create_table('telemetry_samples',
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('sampled_at', sa.BigInteger(), nullable=False),
    sa.Column('utilization_gpu_percent', sa.Float(), nullable=True),
    sa.Column('memory_used_bytes', sa.BigInteger(), nullable=True),
    sa.Column('temperature_c', sa.Float(), nullable=True),
    sa.Column('power_w', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('gpu_id', 'sampled_at'),
    sqlite_with_rowid=False
    )
    with op.batch_alter_table('telemetry_samples', schema=None) as batch_op:
        batch_op.create_index('ix_telemetry_samples_sampled_at', ['sampled_at'], unique=False, postgresql_using='brin')


def _reshape_telemetry_samples(dialect):
    """The first edition's samples (node_id, gpu_uuid, datetime) become (gpu_id, epoch ms) rows."""
    for index in ('ix_telemetry_node_gpu_time', 'ix_telemetry_sampled_at'):
        op.execute(f'DROP INDEX IF EXISTS {index}')
    op.rename_table('telemetry_samples', 'telemetry_samples_first_edition')
    if dialect == 'postgresql':  # the key's index keeps its name through the rename; free it
        op.execute('ALTER INDEX IF EXISTS telemetry_samples_pkey RENAME TO telemetry_samples_first_edition_pkey')
    _create_telemetry_samples()
    if dialect == 'postgresql':
        epoch_ms = 'CAST(ROUND(EXTRACT(EPOCH FROM old.sampled_at) * 1000) AS BIGINT)'
        verb, tail = 'INSERT INTO', ' ON CONFLICT DO NOTHING'
    else:
        epoch_ms = 'CAST(ROUND((julianday(old.sampled_at) - 2440587.5) * 86400000) AS INTEGER)'
        verb, tail = 'INSERT OR IGNORE INTO', ''
    op.execute(
        f'{verb} telemetry_samples (gpu_id, sampled_at, utilization_gpu_percent, memory_used_bytes,'
        f' temperature_c, power_w) SELECT gpus.id, {epoch_ms}, old.utilization_gpu_percent,'
        ' old.memory_used_bytes, old.temperature_c, old.power_w'
        ' FROM telemetry_samples_first_edition AS old'
        ' JOIN gpus ON gpus.node_id = old.node_id AND gpus.uuid = old.gpu_uuid' + tail
    )
    op.drop_table('telemetry_samples_first_edition')


def upgrade():
    dialect = op.get_bind().dialect.name
    inspector = _inspector()
    tables = set(inspector.get_table_names())
    if 'sweep_ticks' not in tables:
        _create_sweep_ticks()
    if 'telemetry_rollups' not in tables:
        _create_telemetry_rollups()
    if 'gpu_uuid' in {column['name'] for column in inspector.get_columns('telemetry_samples')}:
        _reshape_telemetry_samples(dialect)
    elif dialect == 'postgresql':
        # Editions two and three made this index a B-tree; the fourth made it BRIN.
        definition = op.get_bind().execute(sa.text(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_telemetry_samples_sampled_at'"
        )).scalar()
        if definition is not None and 'USING brin' not in definition:
            op.execute('DROP INDEX ix_telemetry_samples_sampled_at')
            op.create_index('ix_telemetry_samples_sampled_at', 'telemetry_samples', ['sampled_at'], postgresql_using='brin')
    lease_indexes = {index['name'] for index in _inspector().get_indexes('node_leases')}
    if 'ix_node_leases_status_heartbeat' not in lease_indexes:
        with op.batch_alter_table('node_leases', schema=None) as batch_op:
            for index in ('ix_node_leases_last_heartbeat_at', 'ix_node_leases_status'):
                if index in lease_indexes:
                    batch_op.drop_index(index)
            batch_op.create_index('ix_node_leases_status_heartbeat', ['status', 'last_heartbeat_at'], unique=False)


def downgrade():
    # Nothing to undo: a repaired database is what 0010 makes on a fresh one.
    pass
