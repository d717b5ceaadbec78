"""Database engine tuning: SQLite pragmas and writer transactions that wait instead of failing;
bounded waits on PostgreSQL; the schema revision the code needs; write health."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import sqlite3
import threading
import time
from pathlib import Path

import sqlalchemy as sa
from flask import Flask, current_app, request
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from app.errors import DomainError
from app.extensions import db

READ_ONLY = "modelforge_read_only"
log = logging.getLogger("modelforge.db")

# P5: every wait on PostgreSQL has a deadline, so a database that stops answering (refused, or a
# black hole that accepts and never replies) costs a request seconds and a 503, never a worker
# (gunicorn kills a sync worker after 30 s). Each is a libpq or pool setting, except the two cuts
# that libpq cannot make because the kernel sees a live peer: the pool's pre-ping and a statement
# past its server-side timeout, which the watchdog ends by shutting the connection's socket.
CONNECT_TIMEOUT_SECONDS = 3  # libpq connect_timeout: the whole start-up, TCP and authentication
PING_TIMEOUT_SECONDS = 2  # the pool's pre-ping, a SELECT 1 a live server answers in milliseconds
STATEMENT_TIMEOUT_SECONDS = 20  # the server's statement_timeout (a migration that needs more sets its own)
STATEMENT_CUT_SECONDS = STATEMENT_TIMEOUT_SECONDS + 5  # the client's, for a server that cannot say so
POOL_TIMEOUT_SECONDS = 5  # waiting for a free pooled connection
# Per process: gthread's 64 threads must not open 64 connections each worker (PostgreSQL allows
# 100 by default, for every worker and replica together).
POOL_SIZE, POOL_OVERFLOW = 4, 4
POSTGRESQL_CONNECT_ARGS = {
    "connect_timeout": CONNECT_TIMEOUT_SECONDS,
    "options": f"-c statement_timeout={STATEMENT_TIMEOUT_SECONDS * 1000}",
    # A peer that vanished (host down, a dropped route) is noticed in 10 + 3 × 5 s when idle, and
    # within 15 s of unacknowledged data when busy.
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 15_000,
}


class WriterQueue:
    """Queues SQLite writers of every process on one file lock, so a waiting writer wakes the
    moment the lock is free.

    SQLite's own busy handler polls with sleeps of 1, 2, 5 … 100 ms, so under several gunicorn
    workers a heartbeat could sleep far longer than the write it waits for. A kernel `flock`
    hands the lock straight to the next waiter. SQLite's busy timeout stays as the fallback for
    writers that do not use this queue (another tool on the same file).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._pid: int | None = None
        self._fd: int | None = None
        # A fork while another thread (the master's scheduler) holds the lock must not hand the
        # child a lock that no thread of its own will ever release.
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._pid = None
        self._fd = None

    def acquire(self) -> None:
        """Wait for this process's turn, then for the file lock."""
        self._thread_lock.acquire()
        if self._depth == 0:
            if self._pid != os.getpid():  # after a fork, open our own description
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                self._pid = os.getpid()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._depth += 1

    def release(self) -> None:
        """Let the next writer in."""
        self._depth -= 1
        if self._depth == 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._thread_lock.release()


def _queued_connection_class(queue: WriterQueue) -> type[sqlite3.Connection]:
    class QueuedConnection(sqlite3.Connection):
        """A sqlite3 connection that leaves the writer queue when its transaction ends."""

        writer_queue = queue
        holds_writer_lock = False

        def _leave_queue(self) -> None:
            if self.holds_writer_lock:
                self.holds_writer_lock = False
                queue.release()

        def commit(self) -> None:
            try:
                super().commit()
            finally:
                self._leave_queue()

        def rollback(self) -> None:
            try:
                super().rollback()
            finally:
                self._leave_queue()

        def close(self) -> None:
            try:
                super().close()
            finally:
                self._leave_queue()

    return QueuedConnection


# The database file and the journal files SQLite keeps beside it. SQLite gives -wal and -shm the
# mode of the database file itself, so a 0600 database keeps them 0600 too.
SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")


def secure_sqlite_files(path: str) -> None:
    """Create the SQLite file 0600 before SQLAlchemy opens it, and tighten one made looser before.

    Left to sqlite3 the file would follow the umask (0644 under most), readable by every local
    user, with the operator sessions, credential hashes and audit log in it.
    """
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    except OSError:
        return  # a missing folder or a read-only file: SQLite's own error says so on first use
    for suffix in SQLITE_SIDE_FILES:
        try:
            status = os.stat(path + suffix)
        except FileNotFoundError:
            continue
        if status.st_uid == os.geteuid() and status.st_mode & 0o077:
            os.chmod(path + suffix, status.st_mode & 0o700)


def engine_options(database_url: str) -> dict[str, object]:
    """SQLAlchemy engine options for the configured database."""
    if database_url.startswith("sqlite"):
        path = sa.make_url(database_url).database
        if path and path != ":memory:" and not path.startswith("file:"):
            secure_sqlite_files(path)
        queue = WriterQueue(f"{path}.writer-lock")
        # The driver's timeout is SQLite's busy timeout: a writer waits up to 30 s for the lock.
        return {
            "connect_args": {
                "timeout": 30,
                "check_same_thread": False,
                "factory": _queued_connection_class(queue),
            }
        }
    # What the operator put in MODELFORGE_DATABASE_URL's query (?connect_timeout=…) wins.
    given = sa.make_url(database_url).query
    connect_args = {name: value for name, value in POSTGRESQL_CONNECT_ARGS.items() if name not in given}
    # A process's threads share at most POOL_SIZE + POOL_OVERFLOW connections; the rest wait for
    # one (POOL_TIMEOUT_SECONDS). Streams and relay connections hold none while they last.
    return {
        "pool_pre_ping": True,
        "pool_size": POOL_SIZE,
        "max_overflow": POOL_OVERFLOW,
        "pool_timeout": POOL_TIMEOUT_SECONDS,
        "connect_args": connect_args,
    }


class Watchdog:
    """Cuts a PostgreSQL connection whose call outlives its deadline: its socket is shut down, so
    the blocked read returns, psycopg raises OperationalError and the request answers 503.

    One thread per process, started on first use (and again in a forked child); arming and
    disarming are a dict operation under a lock, and the cut happens under the same lock, so a
    socket is only ever shut while its call is still running on it.
    """

    TICK_SECONDS = 0.25

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, tuple[float, int]] = {}
        self._pid: int | None = None
        # A fork while this process's watchdog holds the lock must not hand the child a held lock.
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._armed = {}
        self._pid = None

    def arm(self, dbapi_connection, seconds: float) -> None:
        fileno = _socket_of(dbapi_connection)
        if fileno is None:
            return
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._armed.clear()
                threading.Thread(target=self._watch, name="modelforge-db-watchdog", daemon=True).start()
            self._armed[id(dbapi_connection)] = (time.monotonic() + seconds, fileno)

    def disarm(self, dbapi_connection) -> None:
        with self._lock:
            self._armed.pop(id(dbapi_connection), None)

    def _watch(self) -> None:
        pid = os.getpid()
        while self._pid == pid:
            time.sleep(self.TICK_SECONDS)
            now = time.monotonic()
            with self._lock:
                for key, (deadline, fileno) in list(self._armed.items()):
                    if now >= deadline:
                        del self._armed[key]
                        log.warning("database call cut after its deadline: the server did not answer")
                        _shut(fileno)


def _socket_of(dbapi_connection) -> int | None:
    try:
        return dbapi_connection.pgconn.socket
    except Exception:  # closed, or not a psycopg connection
        return None


def _shut(fileno: int) -> None:
    try:
        # Shut the connection itself, not our descriptor of it: a dup is closed, the socket stays ours.
        with socket.socket(fileno=os.dup(fileno)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


WATCHDOG = Watchdog()


def _bound_postgresql(engine: sa.Engine) -> None:
    """Put the watchdog's deadline on every statement and on the pool's pre-ping."""

    @sa.event.listens_for(engine, "before_cursor_execute")
    def arm(connection, _cursor, _statement, _parameters, _context, _executemany):
        WATCHDOG.arm(connection.connection.dbapi_connection, STATEMENT_CUT_SECONDS)

    @sa.event.listens_for(engine, "after_cursor_execute")
    def disarm(connection, _cursor, _statement, _parameters, _context, _executemany):
        WATCHDOG.disarm(connection.connection.dbapi_connection)

    @sa.event.listens_for(engine, "handle_error")
    def disarm_on_error(context):
        try:
            WATCHDOG.disarm(context.connection.connection.dbapi_connection)
        except AttributeError:  # no connection (a failed connect) or one already invalidated
            pass

    ping = engine.dialect.do_ping

    def bounded_ping(dbapi_connection) -> bool:
        WATCHDOG.arm(dbapi_connection, PING_TIMEOUT_SECONDS)
        try:
            return ping(dbapi_connection)
        finally:
            WATCHDOG.disarm(dbapi_connection)

    # The pool calls the dialect's do_ping before each checkout; no event wraps it.
    engine.dialect.do_ping = bounded_ping


def _tune_sqlite(engine: sa.Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def on_connect(dbapi_connection, _record):
        # We issue BEGIN ourselves (below), so the driver must not.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def on_begin(connection):
        # A deferred transaction that later writes fails at once with SQLITE_BUSY when another
        # writer got in first; BEGIN IMMEDIATE takes the write lock up front and waits for it.
        # Read-only requests opt out so readers never queue behind writers (WAL lets them run).
        if connection.get_execution_options().get(READ_ONLY):
            connection.exec_driver_sql("BEGIN DEFERRED")
            return
        dbapi_connection = connection.connection.dbapi_connection
        queue = getattr(dbapi_connection, "writer_queue", None)
        if queue is not None and not dbapi_connection.holds_writer_lock:
            queue.acquire()
            dbapi_connection.holds_writer_lock = True
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def init_app(app: Flask) -> None:
    """Bind Flask-SQLAlchemy, tune the engine for the configured database, and refuse to serve
    on a schema that is not the code's."""
    db.init_app(app)
    schema = app.extensions[SCHEMA_KEY] = SchemaCheck()
    app.extensions[WRITE_PROBE_KEY] = WriteProbe()
    with app.app_context():
        if db.engine.dialect.name == "sqlite":
            _tune_sqlite(db.engine)
        elif db.engine.dialect.name == "postgresql":
            _bound_postgresql(db.engine)

        @sa.event.listens_for(db.engine, "handle_error")
        def schema_may_have_changed(context) -> None:
            if isinstance(context.sqlalchemy_exception, sa.exc.OperationalError | sa.exc.ProgrammingError):
                schema.forget()

    head_revision()  # read the migrations once here, in gunicorn's master, not in each worker's first request
    app.before_request(_refuse_unless_schema_is_current)


def _refuse_unless_schema_is_current() -> None:
    """Every request but a static file: 503 SCHEMA_OUT_OF_DATE while the revision is not the head."""
    if request.endpoint == "static":
        return
    problem = current_app.extensions[SCHEMA_KEY].problem(db.engine)
    if problem is not None:
        raise DomainError(
            "SCHEMA_OUT_OF_DATE",
            problem,
            f"Run `{UPGRADE_COMMAND}` (the control-plane container runs it at start), then retry.",
        )


def write_problem() -> str | None:
    """This app's write health (WriteProbe), for GET /healthz."""
    return current_app.extensions[WRITE_PROBE_KEY].problem(db.engine)


def begin_read_only() -> None:
    """Start this request's transaction as a reader (no SQLite write lock)."""
    db.session.connection(execution_options={READ_ONLY: True})


def insert_ignoring_duplicates(table: sa.Table) -> dict[str, sa.Insert]:
    """`INSERT … ON CONFLICT DO NOTHING` for each supported dialect, keyed by dialect name."""
    return {
        "sqlite": sqlite_insert(table).on_conflict_do_nothing(),
        "postgresql": postgresql_insert(table).on_conflict_do_nothing(),
    }


# ------------------------------------------------------------------ the schema the code needs

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
UPGRADE_COMMAND = "flask --app wsgi db upgrade"
SCHEMA_RECHECK_SECONDS = 2.0


SCHEMA_KEY = "modelforge.schema"
_heads: list[str] = []


def head_revision() -> str:
    """The code's head revision, read from app/migrations once per process."""
    if not _heads:
        from alembic.config import Config
        from alembic.script import ScriptDirectory

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        _heads.append(ScriptDirectory.from_config(config).get_current_head())
    return _heads[0]


class SchemaCheck:
    """Whether the database is at the code's head revision, asked once and cached (per app and process).

    A database behind (or ahead of) the code answers agents with errors that say nothing of the
    cause, so the control plane refuses to serve instead, saying why. Once the revision matches it
    is not asked again until a database error (the `handle_error` hook); while it does not, it is
    asked again at most every SCHEMA_RECHECK_SECONDS, so an upgrade run beside a live server lets
    it serve without a restart.
    """

    def __init__(self) -> None:
        self._current = False
        self._problem: str | None = None
        self._checked_at = 0.0

    def forget(self) -> None:
        """Ask again on the next request (after a database error)."""
        self._current = False

    def problem(self, engine: sa.Engine) -> str | None:
        """None when the schema is the code's; else one sentence naming both revisions."""
        if self._current:
            return None
        if self._problem is not None and time.monotonic() - self._checked_at < SCHEMA_RECHECK_SECONDS:
            return self._problem
        from alembic.migration import MigrationContext

        with engine.connect() as connection:
            revision = MigrationContext.configure(connection).get_current_revision()
        self._checked_at = time.monotonic()
        if revision == head_revision():
            self._current, self._problem = True, None
            return None
        problem = (
            f"The database schema is at revision {revision or 'none (an empty database)'}; this control plane "
            f"needs {head_revision()}."
        )
        if problem != self._problem:
            log.error("%s Run `%s` against MODELFORGE_DATABASE_URL, then retry; refusing to serve until then.",
                      problem, UPGRADE_COMMAND)  # fmt: skip
        self._problem = problem
        return problem


# ------------------------------------------------------------------ write health

WRITE_PROBE_KEY = "modelforge.write_probe"
WRITE_PROBE_SECONDS = 5.0  # a health check asks at most this often per process
# The free space a write needs: SQLite grows the WAL and the file a page at a time, and a burst
# of heartbeats needs a few hundred pages; less than this and writes are about to fail.
WRITE_PROBE_BYTES = 1024 * 1024


class WriteProbe:
    """Whether the database can take a write, cached for WRITE_PROBE_SECONDS.

    SQLite: a write that is rolled back never reaches the disk, and a committed one can still fit
    in a WAL that has room, so neither notices a full disk in time. What fails is a new block:
    the probe asks the database's filesystem for WRITE_PROBE_BYTES (posix_fallocate on a probe
    file beside the database, given back at once), which also fails on a read-only mount, a quota
    or a folder the server may not write in. PostgreSQL: the server says whether it takes writes
    (a standby, or `default_transaction_read_only`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = -WRITE_PROBE_SECONDS
        self._problem: str | None = None

    def problem(self, engine: sa.Engine) -> str | None:
        """None when writes can succeed; else why not (no path: /healthz is public)."""
        with self._lock:
            if time.monotonic() - self._at < WRITE_PROBE_SECONDS:
                return self._problem
            self._problem = self._probe(engine)
            self._at = time.monotonic()
            return self._problem

    def _probe(self, engine: sa.Engine) -> str | None:
        if engine.dialect.name == "sqlite":
            path = engine.url.database
            if not path or path == ":memory:" or path.startswith("file:"):
                return None
            return _filesystem_problem(Path(path))
        with engine.connect() as connection:
            read_only = connection.exec_driver_sql("SHOW transaction_read_only").scalar()
        return "The database server takes no writes (read-only)." if read_only == "on" else None


def _filesystem_problem(database: Path) -> str | None:
    if not os.access(database, os.W_OK):
        log.error("write health: %s is not writable by this process", database)
        return "The database file is not writable."
    probe = database.with_name(database.name + ".write-probe")
    try:
        descriptor = os.open(probe, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(descriptor, 0, WRITE_PROBE_BYTES)
        finally:
            os.ftruncate(descriptor, 0)
            os.close(descriptor)
    except OSError as error:
        log.error("write health: the filesystem of %s refused %d bytes: %s", database, WRITE_PROBE_BYTES, error)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            return "The database's filesystem is full."
        if error.errno == errno.EROFS:
            return "The database's filesystem is read-only."
        return f"The database's filesystem refused a write ({errno.errorcode.get(error.errno, error.errno)})."
    return None
