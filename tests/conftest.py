"""Shared fixtures: the app on real SQLite and real PostgreSQL, a client, and a real gunicorn."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from app import create_app
from app.extensions import db
from tests import support
from tests.tls_support import make_private_ca

POSTGRES_URL_ENV = "MODELFORGE_TEST_POSTGRES_URL"
REQUIRE_ALL_ENV = "MODELFORGE_TEST_REQUIRE_ALL"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI (MODELFORGE_TEST_REQUIRE_ALL=1) a skipped test is a failed test."""
    report = yield
    if os.environ.get(REQUIRE_ALL_ENV) == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped, but {REQUIRE_ALL_ENV}=1 requires every test to run: {report.longrepr}"
    return report


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    """A SQLite file migrated once with Alembic; each test gets a copy."""
    path = tmp_path_factory.mktemp("template") / "template.sqlite3"
    support.migrate(f"sqlite:///{path}", path.parent)
    return path


@pytest.fixture(scope="session")
def postgres_database(tmp_path_factory):
    """A throwaway PostgreSQL database for this test session, migrated once with Alembic."""
    base_url = os.environ.get(POSTGRES_URL_ENV)
    if not base_url:
        pytest.skip(f"{POSTGRES_URL_ENV} is not set")
    name = f"modelforge_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = sa.create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.make_url(base_url).set(database=name).render_as_string(hide_password=False)
    support.migrate(url, tmp_path_factory.mktemp("pg-instance"))
    yield url
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path) -> str:
    """A clean, migrated database: a fresh SQLite copy, or the session's PostgreSQL truncated."""
    if request.param == "sqlite":
        path = tmp_path / "modelforge.sqlite3"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    url = request.getfixturevalue("postgres_database")
    support.truncate_all(url)
    return url


@pytest.fixture
def app(database_url, tmp_path):
    """The control plane bound to the test database."""
    application = create_app(support.app_env(database_url, tmp_path))
    yield application
    with application.app_context():
        db.session.remove()
        db.engine.dispose()


@pytest.fixture
def sqlite_app(sqlite_template, tmp_path):
    """The control plane on a fresh SQLite copy only, for SQLite-specific behaviour."""
    path = tmp_path / "sqlite-only.sqlite3"
    shutil.copyfile(sqlite_template, path)
    application = create_app(support.app_env(f"sqlite:///{path}", tmp_path))
    yield application
    with application.app_context():
        db.session.remove()
        db.engine.dispose()


@pytest.fixture
def client(app):
    """A Flask test client."""
    return app.test_client()


@pytest.fixture
def runner(app):
    """A Flask CLI runner."""
    return app.test_cli_runner()


@pytest.fixture
def server(database_url, tmp_path):
    """The real control plane under gunicorn (several sync workers) on a free loopback port."""
    running = support.GunicornServer(database_url, tmp_path)
    running.start()
    yield running
    running.stop()
    print(running.log()[-20000:])  # shown only when the test fails


@pytest.fixture
def agent_server(sqlite_template, tmp_path):
    """The real control plane for agent tests: SQLite, two workers, a one-second heartbeat interval."""
    with support.gunicorn_on_sqlite_copy(
        sqlite_template, tmp_path / "agent-server.sqlite3", workers=2, MODELFORGE_HEARTBEAT_INTERVAL_SECONDS="1"
    ) as running:
        yield running


@pytest.fixture
def tls_server(sqlite_template, tmp_path):
    """The real control plane serving HTTPS with a certificate from a private CA made here."""
    with support.gunicorn_on_sqlite_copy(
        sqlite_template,
        tmp_path / "tls.sqlite3",
        workers=2,
        tls=make_private_ca(tmp_path),
        MODELFORGE_HEARTBEAT_INTERVAL_SECONDS="1",
    ) as running:
        yield running


@pytest.fixture
def jobs_server(sqlite_template, tmp_path):
    """The control plane for job tests: SQLite, one-second heartbeats and sweeps, a short lease (J2)."""
    with support.gunicorn_on_sqlite_copy(
        sqlite_template,
        tmp_path / "jobs.sqlite3",
        workers=2,
        MODELFORGE_HEARTBEAT_INTERVAL_SECONDS="1",
        MODELFORGE_SWEEP_INTERVAL_SECONDS="1",
        MODELFORGE_JOB_LEASE_SECONDS=str(support.JOB_LEASE_SECONDS),
    ) as running:
        yield running


@pytest.fixture
def hub():
    """The stand-in Hugging Face Hub on loopback (tests/hub_standin.py)."""
    from tests.hub_standin import StandinHub

    with StandinHub() as running:
        yield running


@pytest.fixture
def socket_dir():
    """A short directory for Unix sockets (a sun_path holds 107 bytes; pytest's tmp_path can be longer)."""
    from tests.worker_support import short_socket_dir

    path = short_socket_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)
