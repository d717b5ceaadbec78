"""Alerts end to end (O2): two control planes, four gunicorn workers each, on one PostgreSQL, a real
agent on the fake NVML, and a real receiver that apprise's `json://` posts to.

Each transition is notified exactly once although both replicas' schedulers, each with its own
secret key, sweep the same audit trail; a notification the receiver could not take while it was
down arrives once it is back; and no payload, log or stored error carries the enrolment token,
the node credential, the operator key or the target's own secret.
"""

from __future__ import annotations

import re
import time
from collections import Counter

import requests
import sqlalchemy as sa

from tests.support import ADMIN, FAST_LIVENESS, OPERATOR_KEY, assert_no_secrets, factories, truncate_all, wait_until
from tests.support.agent import FAKE_RTX_4080, AgentProcess, fake_nvml_scenario
from tests.support.alerts import HOOK_SECRET, Receiver
from tests.support.console import csrf_from
from tests.support.gunicorn import GunicornServer

ONE_GPU = fake_nvml_scenario({**FAKE_RTX_4080, "uuid": "GPU-5f3b2c1a-0000-4000-8000-0000000a1e27"})
ENROLLED, OFFLINE, RETURNED = (
    "Node enrolled: alerting node",
    "Node offline: alerting node",
    "Node back online: alerting node",
)


def node_status(url: str, node_id: str) -> str:
    return requests.get(f"{url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10).json()["status"]


def failed_attempts(database_url: str, action: str) -> list[tuple[int, str | None]]:
    engine = sa.create_engine(database_url)
    with engine.connect() as connection:
        rows = connection.execute(
            sa.text("SELECT attempts, last_error FROM alert_deliveries WHERE action = :action"), {"action": action}
        ).all()
    engine.dispose()
    return [tuple(row) for row in rows]


def test_two_control_planes_alert_once_per_transition_and_deliver_after_the_receiver_returns(
    postgres_database, tmp_path
):
    truncate_all(postgres_database)
    receiver = Receiver().start()
    planes = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        # Each replica with its own secret key, as each generates one by default: targets are
        # named by the database's salt, so both still queue the same one delivery per transition.
        planes.append(
            GunicornServer(
                postgres_database,
                tmp_path / name,
                workers=4,
                MODELFORGE_ALERT_URLS=receiver.url(),
                MODELFORGE_SECRET_KEY=f"replica-{name}-secret-key",
                **FAST_LIVENESS,
            )
        )
    first, second = planes
    agents: list[AgentProcess] = []
    try:
        for plane in planes:
            plane.start()
        minted = requests.post(
            first.url + "/api/v1/admin/node-enrollments",
            json={"display_name": "alerting node", "expires_in_seconds": 900},
            headers=ADMIN,
            timeout=10,
        ).json()
        agent = AgentProcess(
            tmp_path,
            first.url,  # the token is bound to the origin it was minted on
            MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"],
            MODELFORGE_AGENT_ACCELERATOR_MODE="nvidia",
        ).with_fake_nvml(ONE_GPU)
        agents.append(agent.start())
        agent.wait_for(r"inventory published")
        node_id, credential = agent.node_id(), agent.credential()
        wait_until(lambda: ENROLLED in receiver.titles(), "the enrolment alert")
        # The first heartbeat follows the inventory: a node killed before it was never online,
        # so it could never go offline.
        wait_until(lambda: node_status(first.url, node_id) == "online", "the node's first heartbeat")

        agent.process.kill()  # no goodbye: the liveness sweep notices, the alert sweep follows
        agent.process.wait()
        wait_until(lambda: OFFLINE in receiver.titles(), "the offline alert", timeout=20)

        receiver.stop()  # the phone's service is down while the node comes back
        restarted = AgentProcess(tmp_path, second.url, MODELFORGE_AGENT_ACCELERATOR_MODE="nvidia").with_fake_nvml(
            ONE_GPU
        )
        agents.append(restarted.start())
        wait_until(
            lambda: any(error for _, error in failed_attempts(postgres_database, "node.returned")),
            "a failed attempt at the returned alert while the receiver is down",
        )
        receiver.start()
        wait_until(lambda: RETURNED in receiver.titles(), "the returned alert after the receiver came back", 20)
        time.sleep(3)  # three more ticks of both schedulers: a duplicate would arrive now

        counts = Counter(receiver.titles())
        assert counts == {ENROLLED: 1, OFFLINE: 1, RETURNED: 1}, counts
        ((attempts, error),) = failed_attempts(postgres_database, "node.returned")
        assert attempts >= 2 and error is None  # retried, then delivered; the old error is cleared
        returned = next(n for n in receiver.notifications if n["title"] == RETURNED)
        assert f"alerting node (node {node_id}) is sending heartbeats again" in returned["message"]

        revoked = requests.post(
            f"{first.url}/api/v1/admin/nodes/{node_id}/credential/revoke", headers=ADMIN, timeout=10
        )
        assert revoked.status_code == 200
        wait_until(lambda: "Credential revoked: alerting node" in receiver.titles(), "the revocation alert")
    finally:
        for running in agents:
            running.stop()
        for plane in planes:
            plane.stop()
        receiver.stop()
        for plane in planes:
            print(plane.log()[-10000:])  # shown only when the test fails

    logs = first.log() + second.log()
    assert len(re.findall(r"scheduler \S+ started", logs)) == 2  # both replicas swept; the database picked
    payloads = receiver.payloads()
    for secret in (minted["token"], credential, OPERATOR_KEY, HOOK_SECRET):
        assert secret not in payloads
    assert_no_secrets(logs, minted["token"], credential, OPERATOR_KEY, HOOK_SECRET)
    # The failed attempts were logged by the masked label, with apprise's reason and no secret.
    assert re.search(
        r"alert \d+ to json://alerts:\*{4}@127\.0\.0\.1:\d+/\.\.\./m\.\.\.e not delivered \(attempt 1\): ", logs
    )


def console_session(url: str) -> requests.Session:
    """A signed-in console session against `url`, through its login form."""
    session = requests.Session()
    login = session.get(f"{url}/login", timeout=10).text
    signed = session.post(
        f"{url}/login",
        data={"operator_key": OPERATOR_KEY, "csrf_token": csrf_from(login)},
        allow_redirects=False,
        timeout=10,
    )
    assert signed.status_code == 302
    return session


def test_a_target_added_on_one_replicas_console_is_sent_to_by_another_with_its_own_secret_key(
    postgres_database, tmp_path
):
    # The stored URL's key comes from the operator key, which replicas behind one console share,
    # not from the secret key, which each may generate for itself.
    truncate_all(postgres_database)
    receiver = Receiver().start()
    planes = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        planes.append(
            GunicornServer(
                postgres_database,
                tmp_path / name,
                workers=2,
                MODELFORGE_SECRET_KEY=f"replica-{name}-secret-key",
                MODELFORGE_SWEEP_INTERVAL_SECONDS="1",
            )
        )
    first, second = planes
    try:
        for plane in planes:
            plane.start()
        console = console_session(first.url)
        page = console.get(f"{first.url}/settings", timeout=10).text
        added = console.post(
            f"{first.url}/settings/alerts/targets",
            data={"url": receiver.url().replace("json://", "http://", 1), "csrf_token": csrf_from(page)},
            timeout=10,
        )
        assert added.status_code == 200 and "Alert target added" in added.text
        first.stop()  # from here on only the other replica runs a scheduler

        other = console_session(second.url)
        page = other.get(f"{second.url}/settings", timeout=10).text
        assert "added here" in page and HOOK_SECRET not in page and "Stored under another" not in page
        key = re.search(r'name="target" value="([0-9a-f]{64})"', page).group(1)
        tested = other.post(
            f"{second.url}/settings/alerts/test", data={"target": key, "csrf_token": csrf_from(page)}, timeout=10
        )
        assert tested.status_code == 200 and "Test alert queued to json://alerts:****@" in tested.text
        wait_until(lambda: receiver.titles() == ["ModelForge test alert"], "the test alert, sent by replica b")

        minted = requests.post(
            second.url + "/api/v1/admin/node-enrollments",
            json={"display_name": "console target node", "expires_in_seconds": 900},
            headers=ADMIN,
            timeout=10,
        ).json()
        enrolled = requests.post(
            second.url + "/api/v1/agent/enroll",
            json=factories.enroll_body(minted["token"], control_plane_url=second.url),
            timeout=10,
        )
        assert enrolled.status_code == 201, enrolled.text
        wait_until(lambda: "Node enrolled: console target node" in receiver.titles(), "the enrolment alert")
    finally:
        for plane in planes:
            plane.stop()
        receiver.stop()
        for plane in planes:
            print(plane.log()[-10000:])  # shown only when the test fails
    logs = first.log() + second.log()
    assert HOOK_SECRET not in logs and "hooks/modelforge" not in logs
    engine = sa.create_engine(postgres_database)
    with engine.connect() as connection:
        stored = connection.execute(sa.text("SELECT label, url_encrypted FROM alert_targets")).all()
    engine.dispose()
    assert len(stored) == 1 and all(HOOK_SECRET not in value and "hooks" not in value for value in stored[0])
