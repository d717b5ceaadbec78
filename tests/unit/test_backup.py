"""`flask --app wsgi modelforge backup` and `restore` on SQLite, in process (issue 22, item 14).

The same commands through real processes, while agents heartbeat, and on PostgreSQL with
pg_dump/pg_restore: tests/e2e/test_backup_restore.py."""

from __future__ import annotations

import shutil
import sqlite3
import stat

import pytest

from app import backup
from app.extensions import db
from tests.support import factories

NODES = 5


def count_nodes(path) -> int:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return connection.execute("SELECT count(*) FROM nodes").fetchone()[0]
    finally:
        connection.close()


@pytest.fixture
def live(sqlite_app):
    """The SQLite app with NODES enrolled nodes, its connections kept open (so the WAL is not
    checkpointed away), and the path of its database file."""
    client = sqlite_app.test_client()
    for index in range(NODES):
        factories.enrolled_node(client, hostname=f"node-{index}")
    with sqlite_app.app_context():
        path = db.engine.url.database
        # Open connections keep the WAL from being checkpointed away, as a running control plane's do.
        keeper = sqlite3.connect(path)
        keeper.execute("SELECT count(*) FROM nodes").fetchone()
        sqlite_app.keeper = keeper
        yield sqlite_app, path
        keeper.close()


def test_a_plain_copy_misses_the_wal_tail_and_the_backup_does_not(live, tmp_path):
    app, path = live
    copied = tmp_path / "cp.sqlite3"
    shutil.copyfile(path, copied)  # what "cp modelforge.sqlite3 …" does
    assert count_nodes(copied) < NODES  # the enrolments are still in modelforge.sqlite3-wal

    runner = app.test_cli_runner()
    result = runner.invoke(args=["modelforge", "backup", str(tmp_path / "backups")])
    assert result.exit_code == 0, result.output
    [made] = (tmp_path / "backups").iterdir()
    assert f"backup written to {made}" in result.output
    assert count_nodes(made) == NODES
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert not made.with_name(made.name + "-wal").exists()  # one self-contained file
    connection = sqlite3.connect(made)
    assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert connection.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    connection.close()
    assert list(tmp_path.joinpath("backups").glob(".*partial")) == []


def test_a_backup_never_overwrites_a_file(live, tmp_path):
    app, _ = live
    existing = tmp_path / "taken.sqlite3"
    existing.write_bytes(b"keep me")
    result = app.test_cli_runner().invoke(args=["modelforge", "backup", str(existing)])
    assert result.exit_code == 1
    assert "exists; name a new file or a directory" in result.output
    assert existing.read_bytes() == b"keep me"


def test_restore_puts_the_copy_back_and_keeps_what_it_replaced(live, tmp_path):
    app, path = live
    made = backup.backup(app.config["SQLALCHEMY_DATABASE_URI"], tmp_path / "before.sqlite3")
    client = app.test_client()
    factories.enrolled_node(client, hostname="after-the-backup")
    db.session.remove()
    db.engine.dispose()  # the control plane stopped
    app.keeper.close()

    result = app.test_cli_runner().invoke(args=["modelforge", "restore", str(made.path)])
    assert result.exit_code == 0, result.output
    assert count_nodes(path) == NODES
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    connection.close()
    [aside] = [line.split("moved aside: ")[1] for line in result.output.splitlines() if "moved aside" in line][:1]
    assert count_nodes(aside) == NODES + 1  # nothing deleted: the replaced database is beside it
    assert stat.S_IMODE((tmp_path / "sqlite-only.sqlite3").stat().st_mode) == 0o600


def test_restore_refuses_a_file_that_is_not_a_sound_modelforge_database(live, tmp_path):
    app, path = live
    db.engine.dispose()
    app.keeper.close()
    other = tmp_path / "other.sqlite3"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"SQLite format 3\x00" + b"\x00" * 200)
    for bad in (other, garbage, tmp_path / "missing.sqlite3"):
        result = app.test_cli_runner().invoke(args=["modelforge", "restore", str(bad)])
        assert result.exit_code == 1, result.output
        assert "Error:" in result.output
    assert count_nodes(path) == NODES  # untouched


def test_without_pg_dump_on_path_the_backup_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no pg_dump
    with pytest.raises(backup.BackupError, match="pg_dump is not on PATH: install the PostgreSQL client"):
        backup.backup("postgresql+psycopg://modelforge:secret@db.invalid/modelforge", tmp_path / "x.dump")
