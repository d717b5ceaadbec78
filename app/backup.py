"""Online backup and offline restore of the control plane's database (issue 22, item 14).

`flask --app wsgi modelforge backup [DESTINATION]` copies the configured database while the
control plane runs and agents keep writing; `flask --app wsgi modelforge restore BACKUP` puts a
copy back while it is stopped. docs/operator-guide.md ("Back up and restore") has the procedure.

SQLite: the copy is made with SQLite's online backup API (`sqlite3.Connection.backup`) in one
step, that is inside one read transaction: a snapshot of every committed transaction, the WAL
included, taken while writers carry on (WAL lets a reader and writers run side by side). A plain
`cp` of the file misses whatever is still in `modelforge.sqlite3-wal`, and copying the file and
its WAL one after the other is not a snapshot either. `VACUUM INTO` would give the same
snapshot, compacted, but rebuilds every table and index (more CPU, longer read transaction) and
takes the destination as SQL text; the backup API copies pages as they are and needs no SQL. The
copy is checked (`PRAGMA integrity_check`, its schema revision read), switched to a rollback
journal so it is one self-contained file, written 0600 and renamed into place only when whole.

PostgreSQL: `pg_dump --format=custom`, which reads one consistent snapshot while the control
plane writes; restore with `pg_restore` into an empty database. The commands call them when they
are on PATH (postgresql-client, the server's major version or newer) and say so when not.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from app.db import SQLITE_SIDE_FILES


class BackupError(Exception):
    """A backup or restore refused or failed; the message says why and what to do."""


@dataclass(frozen=True)
class Outcome:
    """What a backup or restore did."""

    path: Path
    revision: str | None  # the schema revision (Alembic) the copy holds
    size_bytes: int
    moved_aside: tuple[Path, ...] = ()  # restore: the files the restored copy replaced
    database: str | None = None  # restore: where it went (the SQLite file, or the PostgreSQL database)


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def default_destination(instance_path: Path, database_url: str) -> Path:
    """`<instance>/backups/modelforge-<UTC time>.sqlite3` (or `.dump` for PostgreSQL)."""
    suffix = ".dump" if _is_postgresql(database_url) else ".sqlite3"
    return instance_path / "backups" / f"modelforge-{_stamp()}{suffix}"


def _is_postgresql(database_url: str) -> bool:
    return sa.make_url(database_url).get_backend_name() == "postgresql"


def _sqlite_path(database_url: str) -> Path:
    path = sa.make_url(database_url).database
    if not path or path == ":memory:" or path.startswith("file:"):
        raise BackupError(f"cannot back up the SQLite database {path!r}: name a file in MODELFORGE_DATABASE_URL")
    return Path(path)


def _destination(destination: Path, database_url: str) -> Path:
    """A directory (one that exists, or a name without a suffix) gets a time-stamped file inside
    it; an existing file is never overwritten."""
    if destination.is_dir() or not destination.suffix:
        destination.mkdir(mode=0o700, parents=True, exist_ok=True)
        destination = destination / default_destination(Path(), database_url).name
    if destination.exists():
        raise BackupError(f"{destination} exists; name a new file or a directory")
    destination.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return destination


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_sqlite_copy(path: Path) -> str | None:
    """`PRAGMA integrity_check` must say ok; returns the copy's schema revision."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        try:
            problems = [row[0] for row in connection.execute("PRAGMA integrity_check")]
        except sqlite3.DatabaseError as error:
            raise BackupError(f"{path} is not a sound SQLite database: {error}") from None
        if problems != ["ok"]:
            raise BackupError(f"{path} fails PRAGMA integrity_check: {'; '.join(problems[:5])}")
        try:
            row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
        except sqlite3.DatabaseError:
            raise BackupError(f"{path} is not a ModelForge database (no alembic_version table)") from None
        return row[0] if row else None
    finally:
        connection.close()


def backup(database_url: str, destination: Path) -> Outcome:
    """Copy the database online into `destination` (a new file, or a directory for it)."""
    if _is_postgresql(database_url):
        return _pg_dump(database_url, destination)
    source_path = _sqlite_path(database_url)
    if not source_path.is_file():
        raise BackupError(f"no SQLite database at {source_path}")
    target = _destination(destination, database_url)
    partial = Path(tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)[1])
    try:
        os.chmod(partial, 0o600)  # credential hashes, sessions and the audit log are in it
        # 30 s: the busy timeout the control plane's own connections use (app.db).
        source = sqlite3.connect(source_path, timeout=30)
        copy = sqlite3.connect(partial)
        try:
            source.backup(copy)  # pages=-1: every page in one step, one read transaction: a snapshot
            copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
        finally:
            copy.close()
            source.close()
        revision = _check_sqlite_copy(partial)
        with partial.open("rb") as written:
            os.fsync(written.fileno())
        os.rename(partial, target)
        _fsync_directory(target.parent)
    finally:
        partial.unlink(missing_ok=True)
    return Outcome(target, revision, target.stat().st_size)


# --------------------------------------------------------------------------- PostgreSQL


def _libpq(database_url: str) -> tuple[str, dict[str, str]]:
    """The libpq URL for pg_dump/pg_restore, and the environment carrying the password (never argv)."""
    url = sa.make_url(database_url)
    env = dict(os.environ)
    if url.password is not None:
        env["PGPASSWORD"] = str(url.password)
    plain = url.set(drivername="postgresql", password=None)
    return plain.render_as_string(hide_password=False), env


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BackupError(
            f"{name} is not on PATH: install the PostgreSQL client (Debian: apt-get install postgresql-client, "
            f"the server's major version or newer) or run {name} from a postgres image; "
            "docs/operator-guide.md, 'Back up and restore', has the command"
        )
    return found


def _run(command: list[str], env: dict[str, str], what: str) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise BackupError(f"{what} failed (exit {done.returncode}): {' '.join(said[-3:])[:500]}")


def _pg_dump(database_url: str, destination: Path) -> Outcome:
    pg_dump, pg_restore = _tool("pg_dump"), _tool("pg_restore")
    target = _destination(destination, database_url)
    partial = Path(tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)[1])
    url, env = _libpq(database_url)
    try:
        os.chmod(partial, 0o600)
        # One REPEATABLE READ snapshot, taken while the control plane writes.
        _run([pg_dump, "--format=custom", "--no-owner", "--no-privileges", f"--file={partial}", url], env, "pg_dump")
        _run([pg_restore, "--list", str(partial)], env, "pg_restore --list (reading the dump back)")
        with partial.open("rb") as written:
            os.fsync(written.fileno())
        os.rename(partial, target)
        _fsync_directory(target.parent)
    finally:
        partial.unlink(missing_ok=True)
    return Outcome(target, _revision(database_url), target.stat().st_size)


def _revision(database_url: str) -> str | None:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            return connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    except sa.exc.SQLAlchemyError:
        return None
    finally:
        engine.dispose()


def _pg_restore(database_url: str, backup_path: Path) -> Outcome:
    pg_restore = _tool("pg_restore")
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            tables = sa.inspect(connection).get_table_names()
    finally:
        engine.dispose()
    if tables:
        raise BackupError(
            f"the database in MODELFORGE_DATABASE_URL is not empty ({len(tables)} tables): restore into a new, "
            "empty database (dropdb/createdb, or CREATE DATABASE), then run this again"
        )
    url, env = _libpq(database_url)
    _run(
        [
            pg_restore,
            "--no-owner",
            "--no-privileges",
            "--single-transaction",
            "--exit-on-error",
            "-d",
            url,
            str(backup_path),
        ],
        env,
        "pg_restore",
    )
    name = sa.make_url(database_url).render_as_string(hide_password=True)
    return Outcome(backup_path, _revision(database_url), backup_path.stat().st_size, database=name)


# --------------------------------------------------------------------------- restore

# SQLite holds a shared lock on this byte of the -shm file for as long as any connection in WAL
# mode has the database open (its "DMS" lock, src/os_unix.c); an exclusive lock on it means nobody does.
_SHM_DMS_BYTE = 128


def sqlite_in_use(path: Path) -> bool:
    """Whether another process has this SQLite database open (a running control plane)."""
    try:
        fd = os.open(f"{path}-shm", os.O_RDWR)
    except FileNotFoundError:
        return False  # the last connection to close removes it: nobody has the file open
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _SHM_DMS_BYTE)
    except OSError:
        return True
    finally:
        os.close(fd)  # also drops the lock just taken
    return False


def restore(database_url: str, backup_path: Path) -> Outcome:
    """Put a backup in place of the configured database; the control plane must be stopped."""
    if not backup_path.is_file():
        raise BackupError(f"no backup at {backup_path}")
    if _is_postgresql(database_url):
        return _pg_restore(database_url, backup_path)
    live = _sqlite_path(database_url)
    if sqlite_in_use(live):
        raise BackupError(
            f"{live} is open in another process: stop the control plane (docker compose stop control-plane, "
            "or stop gunicorn) and run this again"
        )
    revision = _check_sqlite_copy(backup_path)
    live.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = Path(tempfile.mkstemp(prefix=f".{live.name}.", suffix=".restoring", dir=live.parent)[1])
    moved: list[Path] = []
    try:
        os.chmod(partial, 0o600)
        with backup_path.open("rb") as source, partial.open("wb") as copy:
            shutil.copyfileobj(source, copy, 1 << 20)
            copy.flush()
            os.fsync(copy.fileno())
        # The current files go aside together (a -wal left beside the restored file would be
        # replayed into it): nothing is deleted, so a restore can be undone by moving them back.
        aside = f".before-restore-{_stamp()}"
        for suffix in SQLITE_SIDE_FILES:
            current = Path(f"{live}{suffix}")
            if current.exists():
                moved_to = Path(f"{live}{aside}{suffix}")
                os.rename(current, moved_to)
                moved.append(moved_to)
        os.rename(partial, live)
        _fsync_directory(live.parent)
    finally:
        partial.unlink(missing_ok=True)
    return Outcome(live, revision, live.stat().st_size, tuple(moved), database=str(live))
