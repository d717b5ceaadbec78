"""Migrations are append-only, and a database made at any earlier commit upgrades to the head (issue 22)."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.operations import Operations
from flask_migrate import stamp, upgrade

from app import MIGRATIONS, create_app
from app.db import head_revision
from app.extensions import db
from app.timeutil import UTCDateTime
from tests.support import DATA_DIR, app_env

VERSIONS = MIGRATIONS / "versions"
# The sha256 of every migration as released. A database may exist at any of them, so an edit to one
# that has been applied changes what a fresh database gets but not what that one has (0001 was
# edited three times that way; 0011 repairs it). Add a new migration instead, and its hash here.
# 0008 was made to skip a missing sweep_ticks in issue 22 (it was 9bf1a469…); never again.
RELEASED = {
    "0001_initial_schema.py": "57d1eadaea26c59919ac793a5891b342651686dc879cd1a95510faa45081fa8c",
    "0002_enrollment_agent_image.py": "72f6a3c0149fcd000c22c2dcc11423e0b2020e9aebf281c31f9adda736466725",
    "0003_jobs.py": "b237cf4264981ba6db531b0b716697ea56bf2e04fa12c5b0cf39f13fc5dbbb4a",
    "0004_runtime_worker.py": "f7fa0de8f573b22bbf60c30aee95c4795b127ddfb8ec3c8baa5d0f7ae4a1fcbb",
    "0005_operator_sessions.py": "7979373622c3f084b67244e92540eac8d549315a8306fc2f1e42ff9ddb183646",
    "0006_acceptance.py": "eea3f47f308f848a4b179c26fe0fefb735ed9b85e84519bf6c7480e0c14327f3",
    "0007_alerts.py": "62b44b25076cfb24693bd1690dc2c63f5128c3f745553033d33b3802628df272",
    "0008_sweep_durations.py": "e096870d42164dd76775c73cdbcce2654041b33d5a12729df25154f5d8a45c0e",
    "0009_credential_first_use.py": "ea74757fb73d803c7d9ae31c560bf084bff1065edc94bcb6f3fcfc2b7805c85c",
    "0010_unvalidated_not_eligible.py": "9aada17f4923508de6dc6201ea89b274168ccc19606a7bdb0707101dcdbe331f",
    "0011_first_schema_repair.py": "c62260862e50fc2c82911c04e3c8440bc6e945d1aa49e6831972425ba4ce6101",
    "0012_sweep_heard_since.py": "df4d676e8ba54b622087d3ef7e03fc91b4c1f327573f0a5c785dad755a6384bd",
    "0013_node_credential_refused.py": "e5ffce8acce917c6cbda04aed7bd8150870f828c98b07ca78dd5e594e80d2154",
    "0014_api_keys.py": "beda9db3d210c067746b1fb9ef282ac9f849183270e7b99dfeac765fafd6cabd",
    "0015_deployments.py": "6037870c4e5a1824de0b15504d2f0e0578cf90a8b4fc8474e46c4e1d63ca792e",
    "0016_deployment_served.py": "411868dc3bce2421ad122976c85dd7d3e74f9be67b40a8c23bb5273c81cd6259",
    "0017_node_draining.py": "3d59c1fd504c52466a83b50f22bb5bce15adabc7e8d6807dfe1d5c06b0b567c6",
    "0018_artifact_models.py": "5ad63c66fc16d7d90928e35de63fdb63a187872d60521eaba84c95b558e03e5d",
    "0019_alert_targets.py": "f115c78443059ee551c14f12d984c97ce230505c3a0f60ad8467bc342e995cc4",
    "0020_storage_root_problem.py": "d59b4aede113357c9b46d4e71731cd75dcbb13c7e249c3b317a68041e4ec0c3d",
}
# 0001_initial as its first commit (9c5d073) wrote it, which databases of that time were made by.
FIRST_EDITION = DATA_DIR / "migrations" / "0001_initial_schema_at_9c5d073.py.txt"  # verbatim, so not linted


def test_no_released_migration_is_edited_and_each_new_one_is_recorded():
    found = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(VERSIONS.glob("*.py"))}
    assert set(found) == set(RELEASED), "record each new migration's sha256 in RELEASED (and never edit one)"
    edited = [name for name, digest in found.items() if digest != RELEASED[name]]
    assert edited == [], f"released migrations were edited: {edited}; add a new migration instead"


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request, tmp_path):
    """A database with no tables at all: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'first-edition.sqlite3'}"
        return
    base_url = os.environ.get("MODELFORGE_TEST_POSTGRES_URL")
    if not base_url:
        pytest.skip("MODELFORGE_TEST_POSTGRES_URL is not set")
    name = f"modelforge_first_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    yield sa.make_url(base_url).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def make_first_edition(connection) -> None:
    """Run the first edition of 0001 on `connection`, as `flask db upgrade` did at that commit."""
    loader = importlib.machinery.SourceFileLoader("first_edition_0001", str(FIRST_EDITION))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with Operations.context(MigrationContext.configure(connection)):
        module.upgrade()


def test_a_database_made_at_the_first_migration_commit_upgrades_to_the_head_with_its_data(empty_database, tmp_path):
    app = create_app(app_env(empty_database, tmp_path))
    sampled = datetime(2026, 11, 30, 2, 0, 0, 250000, tzinfo=UTC)
    moment = sa.literal(sampled, UTCDateTime())
    with app.app_context():
        with db.engine.begin() as connection:
            make_first_edition(connection)
            connection.execute(sa.text(
                "INSERT INTO nodes (id, display_name, hostname, labels, production_eligible, lab_eligible,"
                " benchmark_eligible, disabled, created_at, enrolled_at)"
                " VALUES ('n-1', 'old', 'h1', '{}', false, false, false, false, :at, :at)"
            ), {"at": sampled})  # fmt: skip
            connection.execute(sa.text(
                "INSERT INTO node_leases (node_id, status, last_heartbeat_at) VALUES ('n-1', 'online', :at)"
            ), {"at": sampled})  # fmt: skip
            connection.execute(sa.text(
                "INSERT INTO gpus (node_id, uuid, present, first_seen_at, last_seen_at)"
                " VALUES ('n-1', 'GPU-1', true, :at, :at)"
            ), {"at": sampled})  # fmt: skip
            samples = sa.table(
                "telemetry_samples",
                *(sa.column(name) for name in ("node_id", "gpu_uuid", "utilization_gpu_percent", "power_w")),
                sa.column("sampled_at", UTCDateTime()),
                sa.column("received_at", UTCDateTime()),
            )
            connection.execute(samples.insert().values(
                node_id="n-1", gpu_uuid="GPU-1", sampled_at=moment, received_at=moment,
                utilization_gpu_percent=42.0, power_w=99.5,
            ))  # fmt: skip
        stamp(revision="0001_initial")

        upgrade()  # before issue 22: "no such table: sweep_ticks" at 0008

        with db.engine.connect() as connection:
            context = MigrationContext.configure(connection)
            assert context.get_current_revision() == head_revision()
            assert compare_metadata(context, db.metadata) == []
            gpu_id = connection.execute(sa.text("SELECT id FROM gpus WHERE uuid = 'GPU-1'")).scalar()
            rows = connection.execute(sa.text(
                "SELECT gpu_id, sampled_at, utilization_gpu_percent, power_w FROM telemetry_samples"
            )).all()  # fmt: skip
            assert [tuple(row) for row in rows] == [(gpu_id, int(sampled.timestamp() * 1000), 42.0, 99.5)]
            assert connection.execute(sa.text("SELECT status FROM node_leases WHERE node_id = 'n-1'")).scalar() == (
                "online"
            )
            indexes = {index["name"] for index in sa.inspect(connection).get_indexes("node_leases")}
            assert "ix_node_leases_status_heartbeat" in indexes and "ix_node_leases_status" not in indexes
        client = app.test_client()
        assert client.get("/healthz").status_code == 200
        db.engine.dispose()


def test_the_repair_changes_nothing_on_a_database_made_today(database_url, tmp_path):
    from flask_migrate import downgrade

    app = create_app(app_env(database_url, tmp_path))
    with app.app_context():
        downgrade(revision="0010_unvalidated_not_eligible")
        upgrade()
        with db.engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), db.metadata) == []
        db.engine.dispose()


def test_the_data_file_is_the_first_commits_0001():
    text = Path(FIRST_EDITION).read_text()
    assert "Revision ID: 0001_initial" in text and "gpu_uuid" in text and "sweep_ticks" not in text
