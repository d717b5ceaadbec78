"""Database engine tuning: SQLite pragmas and writer transactions that wait instead of failing."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from app.extensions import db

READ_ONLY = "modelforge_read_only"


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
    return {"pool_pre_ping": True, "pool_size": 5, "max_overflow": 10}


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
    """Bind Flask-SQLAlchemy and tune the engine for the configured database."""
    db.init_app(app)
    with app.app_context():
        if db.engine.dialect.name == "sqlite":
            _tune_sqlite(db.engine)


def begin_read_only() -> None:
    """Start this request's transaction as a reader (no SQLite write lock)."""
    db.session.connection(execution_options={READ_ONLY: True})


def insert_ignoring_duplicates(table: sa.Table) -> dict[str, sa.Insert]:
    """`INSERT … ON CONFLICT DO NOTHING` for each supported dialect, keyed by dialect name."""
    return {
        "sqlite": sqlite_insert(table).on_conflict_do_nothing(),
        "postgresql": postgresql_insert(table).on_conflict_do_nothing(),
    }
