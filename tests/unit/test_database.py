"""The database layer: SQLite tuning, writers that wait, constraints, migrations = models."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.exc import IntegrityError

from app.extensions import db
from app.models import Credential, Node
from app.timeutil import utcnow


def test_migrated_schema_matches_the_models(app):
    with app.app_context(), db.engine.connect() as connection:
        context = MigrationContext.configure(connection)
        assert compare_metadata(context, db.metadata) == []
        assert context.get_current_revision() == "0020_storage_root_problem"


def test_upgrading_an_existing_database_keeps_its_enrolments(tmp_path):
    """0001 → 0002 on a database that already has an enrolment; then back down (C4, D5)."""
    from flask_migrate import downgrade, upgrade

    from app import create_app
    from tests.support import app_env

    url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    app = create_app(app_env(url, tmp_path))
    with app.app_context():
        upgrade(revision="0001_initial")
        with db.engine.begin() as connection:
            connection.execute(sa.text(
                "INSERT INTO enrollments (id, token_hash, token_prefix, display_name, labels, production_eligible,"
                " lab_eligible, benchmark_eligible, api_origin, state, created_at, expires_at) VALUES ('e-1',"
                " 'h', 'mfe_x', 'old', '{}', 0, 0, 0, 'http://x', 'pending', '2026-11-30', '2026-12-01')"
            ))  # fmt: skip
        upgrade()
        with db.engine.connect() as connection:
            row = connection.execute(sa.text("SELECT display_name, agent_image FROM enrollments")).one()
        assert tuple(row) == ("old", None)
        downgrade(revision="0001_initial")
        with db.engine.connect() as connection:
            columns = [column["name"] for column in sa.inspect(connection).get_columns("enrollments")]
            assert "agent_image" not in columns
            assert connection.execute(sa.text("SELECT count(*) FROM enrollments")).scalar() == 1


def test_upgrading_to_jobs_keeps_every_node_and_gives_its_lease_no_capabilities(tmp_path):
    """0002 → 0003 on a database with a node: the lease gains `[]` capabilities; then back down (J1, J2)."""
    from flask_migrate import downgrade, upgrade

    from app import create_app
    from tests.support import app_env

    url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    app = create_app(app_env(url, tmp_path))
    with app.app_context():
        upgrade(revision="0002_enrollment_agent_image")
        with db.engine.begin() as connection:
            connection.execute(sa.text(
                "INSERT INTO nodes (id, display_name, hostname, labels, production_eligible, lab_eligible,"
                " benchmark_eligible, disabled, created_at, enrolled_at) VALUES ('n-1', 'old', 'gpu', '{}', 0, 0, 0, 0,"
                " '2026-11-30', '2026-11-30')"
            ))  # fmt: skip
            connection.execute(sa.text("INSERT INTO node_leases (node_id, status) VALUES ('n-1', 'online')"))
        upgrade()
        with db.engine.connect() as connection:
            row = connection.execute(sa.text("SELECT capabilities, storage_roots_version FROM node_leases")).one()
            assert tuple(row) == ("[]", 0)
            assert {"storage_roots", "jobs", "artifacts"} <= set(sa.inspect(connection).get_table_names())
        downgrade(revision="0002_enrollment_agent_image")
        with db.engine.connect() as connection:
            assert "jobs" not in sa.inspect(connection).get_table_names()
            assert connection.execute(sa.text("SELECT count(*) FROM node_leases")).scalar() == 1


def test_upgrading_to_the_runtime_worker_keeps_jobs_and_artifact_links_both_ways(database_url, tmp_path):
    """0003 → 0004 and back, on SQLite and PostgreSQL, with an acquired artifact: its job link survives
    (SQLite rebuilds `jobs` on the way down, which alone would null artifacts.job_id) (W1, W2)."""
    from flask_migrate import downgrade, upgrade

    from app import create_app
    from tests.support import app_env

    app = create_app(app_env(database_url, tmp_path))
    with app.app_context():
        downgrade(revision="0003_jobs")
        with db.engine.begin() as connection:
            connection.execute(sa.text(
                "INSERT INTO nodes (id, display_name, hostname, labels, production_eligible, lab_eligible,"
                " benchmark_eligible, disabled, created_at, enrolled_at) VALUES ('n-1', 'old', 'gpu', '{}', false,"
                " false, false, false, '2026-11-30', '2026-11-30')"
            ))  # fmt: skip
            connection.execute(sa.text("INSERT INTO node_leases (node_id, status) VALUES ('n-1', 'online')"))
            connection.execute(sa.text(
                "INSERT INTO storage_roots (id, node_id, name, host_path, container_path, min_free_bytes, created_at)"
                " VALUES ('r-1', 'n-1', 'models', '/h', '/c', 0, '2026-11-30')"
            ))  # fmt: skip
            connection.execute(sa.text(
                "INSERT INTO jobs (id, type, node_id, storage_root_id, params, state, attempt, max_attempts,"
                " cancel_requested, created_at) VALUES ('j-1', 'artifact.acquire.v1', 'n-1', 'r-1', '{}',"
                " 'succeeded', 1, 3, false, '2026-11-30')"
            ))  # fmt: skip
            connection.execute(sa.text(
                "INSERT INTO artifacts (id, node_id, storage_root_id, repo_id, repo_type, revision, \"commit\","
                " container_path, host_path, files, total_bytes, verified_at, job_id) VALUES ('a-1', 'n-1', 'r-1',"
                " 'o/n', 'model', 'main', 'c', '/c/x', '/h/x', 1, 1, '2026-11-30', 'j-1')"
            ))  # fmt: skip
        upgrade()
        with db.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT job_id FROM artifacts")).scalar() == "j-1"
            assert connection.execute(sa.text("SELECT artifact_id FROM jobs")).scalar() is None
            lease = connection.execute(
                sa.text("SELECT runtime_worker, runtime_worker_problem, worker_compatibility FROM node_leases")
            ).one()
            assert tuple(lease) == (None, None, None)
        downgrade(revision="0003_jobs")
        with db.engine.connect() as connection:
            assert "artifact_id" not in [column["name"] for column in sa.inspect(connection).get_columns("jobs")]
            assert connection.execute(sa.text("SELECT job_id FROM artifacts")).scalar() == "j-1"
            indexes = {index["name"] for index in sa.inspect(connection).get_indexes("jobs")}
            assert "uq_jobs_one_running_per_node" in indexes
        upgrade()
        db.engine.dispose()


def test_operator_sessions_migrate_up_and_down_on_both_databases(database_url, tmp_path):
    """0004 → 0005 adds `operator_sessions` (hash unique, expiry indexed); back down drops it (C1)."""
    from flask_migrate import downgrade, upgrade

    from app import create_app
    from tests.support import app_env

    app = create_app(app_env(database_url, tmp_path))
    with app.app_context():
        downgrade(revision="0004_runtime_worker")
        with db.engine.connect() as connection:
            assert "operator_sessions" not in sa.inspect(connection).get_table_names()
        upgrade()
        with db.engine.connect() as connection:
            inspector = sa.inspect(connection)
            assert "operator_sessions" in inspector.get_table_names()
            unique = inspector.get_unique_constraints("operator_sessions")
            assert [constraint["column_names"] for constraint in unique] == [["token_hash"]]
            indexed = [index["column_names"] for index in inspector.get_indexes("operator_sessions")]
            assert ["expires_at"] in indexed
        db.engine.dispose()


def test_a_node_eligible_before_acceptance_evidence_is_made_ineligible_audited(database_url, tmp_path):
    """0009 → 0010: a node enrolled production eligible without validation is cleared, with why (V1)."""
    from flask_migrate import downgrade, upgrade

    from app import create_app
    from app.models import AuditEvent
    from tests.support import app_env

    app = create_app(app_env(database_url, tmp_path))
    with app.app_context():
        downgrade(revision="0009_credential_first_use")
        with db.engine.begin() as connection:
            connection.execute(
                sa.insert(Node.__table__),
                [
                    {"id": "n-eligible", "display_name": "old", "hostname": "h1", "production_eligible": True},
                    {"id": "n-not", "display_name": "new", "hostname": "h2", "production_eligible": False},
                ],
            )
        upgrade()
        db.session.remove()
        eligible = dict(db.session.execute(sa.select(Node.id, Node.production_eligible)).all())
        assert eligible == {"n-eligible": False, "n-not": False}
        events = db.session.scalars(sa.select(AuditEvent)).all()
        assert [(event.actor, event.action, event.node_id) for event in events] == [
            ("system", "node.production_eligibility_cleared", "n-eligible")
        ]
        assert events[0].details == {"reasons": ["acceptance evidence introduced (V1)"]}
        assert abs((utcnow() - events[0].at).total_seconds()) < 60
        db.session.remove()
        db.engine.dispose()


def test_sqlite_runs_in_wal_with_foreign_keys_and_a_busy_timeout(sqlite_app):
    with sqlite_app.app_context(), db.engine.connect() as connection:
        pragma = lambda name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()  # noqa: E731
        assert pragma("journal_mode") == "wal"
        assert pragma("foreign_keys") == 1
        assert pragma("synchronous") == 1  # NORMAL
        assert pragma("busy_timeout") == 30000


def test_concurrent_sqlite_writers_wait_instead_of_failing(sqlite_app):
    with sqlite_app.app_context():
        db.session.add(Node(id="n-1", display_name="n", hostname="h"))
        db.session.commit()
        engine = db.engine
    holding = threading.Event()
    errors: list[BaseException] = []

    def slow_writer():
        with engine.begin() as connection:  # BEGIN IMMEDIATE: takes the write lock now
            connection.execute(sa.text("UPDATE nodes SET display_name = 'slow' WHERE id = 'n-1'"))
            holding.set()
            time.sleep(0.5)

    def second_writer():
        holding.wait()
        try:
            with engine.begin() as connection:
                # A deferred transaction would read, then fail to upgrade with SQLITE_BUSY.
                connection.execute(sa.text("SELECT display_name FROM nodes")).all()
                connection.execute(sa.text("UPDATE nodes SET display_name = 'second' WHERE id = 'n-1'"))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=slow_writer), threading.Thread(target=second_writer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT display_name FROM nodes")).scalar() == "second"


def test_the_database_refuses_a_second_active_credential(app):
    with app.app_context():
        db.session.add(Node(id="n-1", display_name="n", hostname="h"))
        db.session.flush()
        db.session.add(Credential(node_id="n-1", token_hash="a" * 64, prefix="mfn_a"))
        db.session.commit()
        db.session.add(Credential(node_id="n-1", token_hash="b" * 64, prefix="mfn_b"))
        with pytest.raises(IntegrityError):
            db.session.commit()
        db.session.rollback()
        # A revoked one does not count (I5).
        db.session.add(Credential(node_id="n-1", token_hash="c" * 64, prefix="mfn_c", revoked_at=utcnow()))
        db.session.commit()


def test_timestamps_come_back_timezone_aware_utc(app):
    with app.app_context():
        db.session.add(Node(id="n-1", display_name="n", hostname="h"))
        db.session.commit()
        db.session.expire_all()
        node = db.session.get(Node, "n-1")
        assert node.created_at.utcoffset().total_seconds() == 0


def test_postgresql_waits_are_bounded(tmp_path):
    """P5 (issue 22): connect, statement, pool and keepalives are bounded; the URL's own choice wins."""
    from app.db import CONNECT_TIMEOUT_SECONDS, POOL_TIMEOUT_SECONDS, STATEMENT_TIMEOUT_SECONDS, engine_options

    options = engine_options("postgresql+psycopg://u@db.example/modelforge")
    assert options["pool_timeout"] == POOL_TIMEOUT_SECONDS and options["pool_pre_ping"] is True
    connect = options["connect_args"]
    assert connect["connect_timeout"] == CONNECT_TIMEOUT_SECONDS
    assert connect["options"] == f"-c statement_timeout={STATEMENT_TIMEOUT_SECONDS * 1000}"
    assert connect["keepalives"] == 1 and connect["tcp_user_timeout"] > 0
    mine = engine_options("postgresql+psycopg://u@db.example/modelforge?connect_timeout=30")["connect_args"]
    assert "connect_timeout" not in mine  # the operator's ?connect_timeout=30 is left to libpq


def test_the_watchdog_cuts_a_postgresql_call_past_its_deadline(postgres_database, tmp_path):
    """The cut libpq cannot make when the peer's kernel still acknowledges (a black hole): the
    socket is shut, the call fails at once with OperationalError, and the pool carries on."""
    from app import create_app
    from app.db import WATCHDOG
    from tests.support import app_env

    app = create_app(app_env(postgres_database, tmp_path))
    with app.app_context():
        with db.engine.connect() as connection:
            dbapi_connection = connection.connection.dbapi_connection
            started = time.monotonic()
            WATCHDOG.arm(dbapi_connection, 0.5)
            with pytest.raises(db.engine.dialect.loaded_dbapi.OperationalError, match="closed the connection"):
                dbapi_connection.execute("SELECT pg_sleep(10)")
            assert time.monotonic() - started < 3
        with db.engine.connect() as connection:  # the cut connection was dropped; a fresh one answers
            assert connection.execute(sa.text("SELECT 1")).scalar() == 1
        db.engine.dispose()
