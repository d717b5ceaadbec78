"""Database engine tuning: SQLite pragmas and writer transactions that wait instead of failing."""

from __future__ import annotations

import sqlalchemy as sa
from flask import Flask

from app.extensions import db

READ_ONLY = "modelforge_read_only"


def engine_options(database_url: str) -> dict[str, object]:
    """SQLAlchemy engine options for the configured database."""
    if database_url.startswith("sqlite"):
        # The driver's timeout is SQLite's busy timeout: a writer waits up to 30 s for the lock.
        return {"connect_args": {"timeout": 30, "check_same_thread": False}}
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
        else:
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
