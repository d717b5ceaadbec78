"""Backup while real agents heartbeat, stop, restore, start: the agents carry on (issue 22, item 14).

The real control plane under gunicorn, two real agents on the fake NVML, the operator's commands
as the operator runs them (`flask --app wsgi modelforge backup|restore`), on SQLite and on
PostgreSQL (pg_dump/pg_restore). One node's credential is rotated after the backup: after the
restore its agent is refused (401, exit 5), the console says so and what to do, and the steps
it names bring the node back."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

import modelforge_node_agent
from tests.support import ADMIN, PROJECT_ROOT, wait_until
from tests.support.agent import FAKE_RTX_4080, fake_nvml_scenario, nvidia_agent
from tests.support.console import csrf_from
from tests.support.gunicorn import GunicornServer

STEADY_GPU = {**FAKE_RTX_4080, "uuid": "GPU-5f3b2c1a-0000-4000-8000-0000000000aa"}
ROTATED_GPU = {**FAKE_RTX_4080, "uuid": "GPU-5f3b2c1a-0000-4000-8000-0000000000bb"}


def flask_command(server: GunicornServer, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`flask --app wsgi modelforge …` with the control plane's own settings, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", "wsgi", "modelforge", *args],
        cwd=PROJECT_ROOT,
        env={**server.env, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def node(server: GunicornServer, node_id: str) -> dict:
    response = requests.get(f"{server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def beat_after(server: GunicornServer, node_id: str, moment: str, timeout: float = 60) -> dict:
    """Wait for an accepted heartbeat of this node later than `moment` (ISO 8601 UTC)."""
    found = {}

    def later() -> bool:
        found.update(node(server, node_id))
        return found["status"] == "online" and (found["last_heartbeat_at"] or "") > moment

    wait_until(later, f"a heartbeat of {node_id} after {moment}", timeout=timeout)
    return found


def acknowledged(database_url: str) -> dict[str, set]:
    """Every row the control plane had committed (so acknowledged) at this moment, by key."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            return {
                "nodes": set(connection.exec_driver_sql("SELECT id FROM nodes").scalars()),
                "credentials": set(connection.exec_driver_sql("SELECT token_hash FROM credentials").scalars()),
                "audit": set(connection.exec_driver_sql("SELECT id FROM audit_events").scalars()),
                "samples": set(connection.exec_driver_sql("SELECT gpu_id, sampled_at FROM telemetry_samples").all()),
            }
    finally:
        engine.dispose()


def console_page(server: GunicornServer, path: str) -> str:
    """A console page through the real login form."""
    session = requests.Session()
    login = session.get(server.url + "/login", timeout=10)
    signed = session.post(
        server.url + "/login",
        data={"operator_key": ADMIN["X-ModelForge-Admin-Token"], "csrf_token": csrf_from(login.text)},
        timeout=10,
        allow_redirects=False,
    )
    assert signed.status_code == 302, signed.text
    page = session.get(server.url + path, timeout=10)
    assert page.status_code == 200
    return page.text


def install_credential(agent, server: GunicornServer) -> None:
    """What the console's replace-credential snippet does: rotate, write node-credential 0600."""
    rotated = requests.post(
        f"{server.url}/api/v1/admin/nodes/{agent.node_id()}/credential/rotate", headers=ADMIN, timeout=10
    )
    assert rotated.status_code == 201, rotated.text
    assert agent.process.wait(timeout=30) == 5  # the running agent is refused and stops
    modelforge_node_agent.write_private_file(agent.state_dir / "node-credential", rotated.json()["credential"])


@pytest.fixture
def restored_url(database_url):
    """Where the restore goes: the same SQLite file; a new, empty PostgreSQL database."""
    if database_url.startswith("sqlite"):
        yield database_url
        return
    name = f"modelforge_restored_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(os.environ["MODELFORGE_TEST_POSTGRES_URL"], isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    yield sa.make_url(database_url).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def test_backup_while_agents_heartbeat_then_restore_and_they_carry_on(database_url, restored_url, tmp_path):
    sqlite = database_url.startswith("sqlite")
    server = GunicornServer(database_url, tmp_path, workers=2, MODELFORGE_HEARTBEAT_INTERVAL_SECONDS="1")
    server.start(timeout=60)
    steady, _ = nvidia_agent(tmp_path, server, fake_nvml_scenario(STEADY_GPU), name="steady")
    rotated, _ = nvidia_agent(tmp_path, server, fake_nvml_scenario(ROTATED_GPU), name="rotated")
    try:
        steady.start()
        rotated.start()
        for agent in (steady, rotated):
            agent.wait_for(r"inventory published", timeout=60)
            beat_after(server, agent.node_id(), "")

        # The backup, while both agents heartbeat once a second.
        before = acknowledged(database_url)
        started = time.monotonic()
        made = flask_command(server, "backup", str(tmp_path / "backups"))
        assert made.returncode == 0, made.stderr
        backup_file = Path(re.search(r"backup written to (\S+)", made.stdout).group(1))
        print(f"backup took {time.monotonic() - started:.2f}s: {made.stdout.strip()}")
        assert backup_file.stat().st_mode & 0o077 == 0
        during = acknowledged(database_url)
        assert len(during["samples"]) > len(before["samples"])  # the agents wrote on meanwhile

        # After the backup: one node's credential is rotated and installed (so the backup never saw it).
        install_credential(rotated, server)
        rotated.start()
        rotated.wait_for(r"starting with its stored credential", timeout=30)
        newest = node(server, rotated.node_id())["last_heartbeat_at"]
        beat_after(server, rotated.node_id(), newest)

        if sqlite:  # a restore under a running control plane is refused, and changes nothing
            refused = flask_command(server, "restore", str(backup_file))
            assert refused.returncode == 1
            assert "open in another process: stop the control plane" in refused.stderr

        # Stop, restore, migrate, start: what the operator guide says, in that order.
        server.stop()
        restore_env = {"MODELFORGE_DATABASE_URL": restored_url}
        put_back = flask_command(server, "restore", str(backup_file), **restore_env)
        assert put_back.returncode == 0, put_back.stderr
        upgraded = subprocess.run(
            [sys.executable, "-m", "flask", "--app", "wsgi", "db", "upgrade"],
            cwd=PROJECT_ROOT,
            env={**server.env, **restore_env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert upgraded.returncode == 0, upgraded.stderr
        if sqlite:
            live = sa.make_url(restored_url).database
            connection = sqlite3.connect(live)
            assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            connection.close()

        # Nothing acknowledged before the backup started is missing.
        after = acknowledged(restored_url)
        for kind, rows in before.items():
            assert rows <= after[kind], f"{kind}: {len(rows - after[kind])} acknowledged rows lost"

        server.env.update(restore_env)
        server.start(timeout=60)  # the same address: the agents never change their URL
        restarted_at = node(server, steady.node_id())["last_heartbeat_at"]

        # The steady agent carries on with its credential, its identity and its history.
        back = beat_after(server, steady.node_id(), restarted_at, timeout=60)
        assert back["status"] == "online"
        assert steady.process.poll() is None

        # The rotated one presents a credential the restored database never saw: 401, exit 5, stays down.
        assert rotated.process.wait(timeout=60) == 5
        assert "HTTP 401 CREDENTIAL_INVALID" in rotated.log()
        page = console_page(server, f"/hardware/nodes/{rotated.node_id()}")
        assert 'data-testid="credential-refused-banner"' in page
        assert "presented a credential that no longer matches" in page
        assert 'data-testid="credential-refused"' in console_page(server, "/hardware/nodes")
        assert 'data-testid="credential-refused-banner"' not in console_page(
            server, f"/hardware/nodes/{steady.node_id()}"
        )
        assert rotated.credential() not in server.log()

        # The steps the page names: rotate, install, start. The node is back, the hint gone.
        rotate = requests.post(
            f"{server.url}/api/v1/admin/nodes/{rotated.node_id()}/credential/rotate", headers=ADMIN, timeout=10
        )
        assert rotate.status_code == 201
        modelforge_node_agent.write_private_file(rotated.state_dir / "node-credential", rotate.json()["credential"])
        rotated.start()
        beat_after(server, rotated.node_id(), restarted_at, timeout=60)
        assert 'data-testid="credential-refused-banner"' not in console_page(
            server, f"/hardware/nodes/{rotated.node_id()}"
        )
    finally:
        steady.stop()
        rotated.stop()
        server.stop()
        print(server.log()[-20000:])
