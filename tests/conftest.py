"""The suite's tiers, and the fixtures more than one tier uses: the app on real SQLite and real
PostgreSQL, a client, a real gunicorn, the stand-in Hub, and the processes a test starts.

Tiers (one place: TIERS below). A test's tier is the folder it lives in, and every test is in
exactly one: a test file outside the tier folders, or a test that names another tier's marker,
stops the run at collection. `pytest -m e2e` (or `make test-fast` for `unit`) selects by marker.
Fixtures only one tier needs live in that tier's conftest.py; helpers are plain modules in
tests/support/, and no test module imports another."""

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
from tests.support import acquire, gunicorn, serving
from tests.support.alerts import Receiver
from tests.support.tls import make_private_ca

POSTGRES_URL_ENV = "MODELFORGE_TEST_POSTGRES_URL"
REQUIRE_ALL_ENV = "MODELFORGE_TEST_REQUIRE_ALL"
TESTS = Path(__file__).resolve().parent
TIERS = {
    "unit": "in process: the Flask test client, SQLite in tmp_path (PostgreSQL too in `make test`), no subprocess",
    "e2e": "real processes: gunicorn, the agent, nginx, Prometheus, bash and shellcheck, PostgreSQL replicas",
    "browser": "Debian's Chromium drives the console through Playwright",
    "containers": "podman builds and runs the images",
    "llama": "llama.cpp: the real runtime worker on a tiny GGUF model",
}


def pytest_addoption(parser):
    parser.addoption(
        "--sqlite-only",
        action="store_true",
        help="deselect the PostgreSQL half of database-parametrized tests (make test-fast)",
    )


def pytest_configure(config):
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: tier: {what}")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Mark each test with its folder's tier; refuse a test with no tier or with two."""
    misplaced, deselected, kept = [], [], []
    for item in items:
        parts = Path(item.path).resolve().relative_to(TESTS).parts
        tier = parts[0] if len(parts) > 1 and parts[0] in TIERS else None
        named = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
        if tier is None or named - {tier}:
            misplaced.append(f"{item.nodeid} (folder tier {tier}, markers {sorted(named)})")
            continue
        item.add_marker(tier)
        if tier == "containers":  # one podman image store: its builds and compose projects run in turn
            item.add_marker(pytest.mark.xdist_group("containers"))
        callspec = getattr(item, "callspec", None)
        if config.getoption("sqlite_only") and callspec and callspec.params.get("database_url") == "postgresql":
            deselected.append(item)
        else:
            kept.append(item)
    if misplaced:
        raise pytest.UsageError(
            "every test belongs to exactly one tier, the folder it lives in (tests/<tier>/, TIERS in "
            "tests/conftest.py):\n  " + "\n  ".join(misplaced)
        )
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


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
    running = gunicorn.GunicornServer(database_url, tmp_path)
    running.start()
    yield running
    running.stop()
    print(running.log()[-20000:])  # shown only when the test fails


@pytest.fixture
def agent_server(sqlite_template, tmp_path):
    """The real control plane for agent tests: SQLite, two workers, a one-second heartbeat interval."""
    with gunicorn.gunicorn_on_sqlite_copy(
        sqlite_template, tmp_path / "agent-server.sqlite3", workers=2, MODELFORGE_HEARTBEAT_INTERVAL_SECONDS="1"
    ) as running:
        yield running


@pytest.fixture
def tls_server(sqlite_template, tmp_path):
    """The real control plane serving HTTPS with a certificate from a private CA made here."""
    with gunicorn.gunicorn_on_sqlite_copy(
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
    with gunicorn.gunicorn_on_sqlite_copy(
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
    """The stand-in Hugging Face Hub on loopback (tests/support/hub.py)."""
    from tests.support.hub import StandinHub

    with StandinHub() as running:
        yield running


@pytest.fixture
def socket_dir():
    """A short directory for Unix sockets (a sun_path holds 107 bytes; pytest's tmp_path can be longer)."""
    from tests.support.worker import short_socket_dir

    path = short_socket_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test():
    """A failing test stops mid-body: the agents and workers it started are stopped here all the same."""
    yield
    acquire.stop_started_agents()
    serving.stop_started_workers()


@pytest.fixture
def model_repo(tmp_path, hub) -> str:
    """org/tiny-gguf on the stand-in Hub: a loadable model, a file that is not GGUF and a truncated GGUF."""
    from tests.support.tiny_gguf import write_not_gguf, write_tiny_llama, write_truncated

    models = tmp_path / "made"
    models.mkdir()
    files = {
        "tiny.gguf": write_tiny_llama(models / "tiny.gguf"),
        "broken.gguf": write_truncated(models / "broken.gguf"),
        "notes.txt": write_not_gguf(models / "notes.txt"),
        "README.md": b"# a tiny random llama\n",
    }
    hub.add_repo(
        "org/tiny-gguf", {path: Path(value) if isinstance(value, Path) else value for path, value in files.items()}
    )
    return "org/tiny-gguf"


@pytest.fixture
def receiver():
    """An alert receiver (a JSON webhook) on loopback."""
    running = Receiver().start()
    yield running
    running.stop()
