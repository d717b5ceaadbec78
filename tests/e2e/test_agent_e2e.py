"""The real agent against the real control plane under gunicorn (I1–I3, A2–A4, E2, N2, N3, P2)."""

from __future__ import annotations

import json
import re
import time

import pytest
import requests

from tests.support import ADMIN, assert_no_secrets, wait_until
from tests.support.agent import FAKE_RTX_4080, AgentProcess, fake_nvml_scenario, mint_token, nvidia_agent
from tests.support.gunicorn import gunicorn_on_sqlite_copy

A3_CONNECT = r"ConnectError on POST /api/v1/agent/heartbeat \(backoff 1s…16s\); next try in (\d+)s"


def node(server, node_id):
    response = requests.get(f"{server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def wait_for_heartbeat_after(server, node_id, after: str | None, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = node(server, node_id)
        if current["last_heartbeat_at"] and current["last_heartbeat_at"] != after:
            return current
        time.sleep(0.2)
    raise AssertionError(f"no heartbeat after {after} within {timeout}s")


def beats_accepted(server) -> int:
    """How many heartbeats gunicorn's access log shows answered 200."""
    return len(re.findall(r'"POST /api/v1/agent/heartbeat HTTP/1.1" 200', server.log()))


def test_enrol_publish_restart_without_token_keeps_identity(agent_server, tmp_path):
    minted = mint_token(agent_server.url)
    agent = AgentProcess(tmp_path, agent_server.url, MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"]).start()
    agent.wait_for(r"inventory published")
    node_id = agent.node_id()
    credential = agent.credential()
    online = wait_for_heartbeat_after(agent_server, node_id, None)
    assert online["status"] == "online" and online["hostname"] == "agent-host"
    assert online["health"]["status"] == "ok"
    assert online["inventory"]["accelerator_mode"] == "cpu"
    assert set(online["inventory"]["storage"]) == {"state", "hf-cache", "artifacts", "quarantine"}
    assert online["inventory"]["cpu_count"] >= 1 and online["inventory"]["memory_total_bytes"] > 0
    assert online["gpus"] == [] and online["telemetry"] == []
    enrolment = requests.get(
        f"{agent_server.url}/api/v1/admin/node-enrollments/{minted['id']}", headers=ADMIN, timeout=10
    ).json()
    assert enrolment["state"] == "consumed" and enrolment["node_id"] == node_id
    assert agent.stop() < 1.0 and agent.process.returncode == 0

    # I3: the token is gone from the environment; the stored credential carries on.
    restarted = AgentProcess(tmp_path, agent_server.url)
    restarted.start()
    restarted.wait_for(r"starting with its stored credential")
    assert restarted.node_id() == node_id and restarted.credential() == credential
    wait_for_heartbeat_after(agent_server, node_id, node(agent_server, node_id)["last_heartbeat_at"])
    listed = requests.get(agent_server.url + "/api/v1/hardware/nodes", headers=ADMIN, timeout=10).json()["nodes"]
    assert [item["id"] for item in listed] == [node_id]
    assert restarted.stop() < 1.0

    # I3 again: a stale token still in the environment is ignored, not re-claimed.
    with_token = AgentProcess(tmp_path, agent_server.url, MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"])
    assert with_token.run("--once") == 0
    assert "ignoring MODELFORGE_AGENT_ENROLLMENT_TOKEN" in with_token.log()
    agent_server.stop()
    for text in (agent.log(), with_token.log(), agent_server.log()):
        assert_no_secrets(text, minted["token"], credential)


def test_outage_backs_off_then_publishing_resumes_with_the_same_identity(agent_server, tmp_path):
    minted = mint_token(agent_server.url)
    agent = AgentProcess(tmp_path, agent_server.url, MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"]).start()
    agent.wait_for(r"inventory published")
    node_id = agent.node_id()

    agent_server.stop()
    matches = agent.wait_for(A3_CONNECT, timeout=20, count=3)
    assert [int(match.group(1)) for match in matches[:3]] == [1, 2, 4]  # growing, from 1 s
    before = agent.log().count("ConnectError")
    agent_server.start()
    restarted_at = time.monotonic()
    agent.wait_for(r"publishing again after \d+ failed attempt", timeout=25)
    # Back within the backoff then in force (at most 16 s + 20 % jitter).
    assert time.monotonic() - restarted_at < 16 * 1.2 + 1
    current = wait_for_heartbeat_after(agent_server, node_id, None)
    assert current["status"] == "online" and agent.node_id() == node_id
    assert "enrolled as node" in agent.log() and agent.log().count("enrolled as node") == 1
    assert before >= 3
    credential = agent.credential()
    agent.stop()
    agent_server.stop()
    assert_no_secrets(agent.log() + agent_server.log(), minted["token"], credential)


def test_revoked_credential_exits_5_naming_the_refusal(agent_server, tmp_path):
    minted = mint_token(agent_server.url)
    agent = AgentProcess(tmp_path, agent_server.url, MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"]).start()
    agent.wait_for(r"inventory published")
    credential = agent.credential()
    revoked = requests.post(
        f"{agent_server.url}/api/v1/admin/nodes/{agent.node_id()}/credential/revoke", headers=ADMIN, timeout=10
    )
    assert revoked.status_code == 200
    assert agent.process.wait(timeout=10) == 5
    assert "HTTP 401 CREDENTIAL_REVOKED on POST /api/v1/agent/heartbeat" in agent.log()
    agent_server.stop()
    assert_no_secrets(agent.log() + agent_server.log(), minted["token"], credential)


def test_second_agent_with_a_copied_token_exits_4(agent_server, tmp_path):
    minted = mint_token(agent_server.url)
    first = AgentProcess(tmp_path, agent_server.url, "first", MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"])
    assert first.run("--once") == 0
    second = AgentProcess(tmp_path, agent_server.url, "second", MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"])
    assert second.run("--once") == 4
    assert "HTTP 409 ENROLLMENT_TOKEN_CONSUMED on POST /api/v1/agent/enroll" in second.log()
    assert "single use" in second.log()  # the next step, from the error body's message fields
    assert not (second.state_dir / "node-credential").exists()
    agent_server.stop()
    assert_no_secrets(first.log() + second.log() + agent_server.log(), minted["token"], first.credential())


def test_origin_mismatch_exits_4_naming_the_expected_origin(agent_server, tmp_path):
    minted = mint_token(agent_server.url)
    other_origin = agent_server.url.replace("127.0.0.1", "localhost")
    agent = AgentProcess(tmp_path, other_origin, MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"])
    assert agent.run("--once") == 4
    assert "HTTP 409 API_ORIGIN_MISMATCH on POST /api/v1/agent/enroll" in agent.log()
    assert f"MODELFORGE_AGENT_CONTROL_PLANE_URL={agent_server.url}" in agent.log()
    assert_no_secrets(agent.log(), minted["token"])


def test_disabled_node_keeps_checking_and_resumes_when_enabled(agent_server, tmp_path):
    minted = mint_token(agent_server.url)
    agent = AgentProcess(tmp_path, agent_server.url, MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"]).start()
    agent.wait_for(r"inventory published")
    node_id = agent.node_id()
    requests.post(f"{agent_server.url}/api/v1/admin/nodes/{node_id}/disable", headers=ADMIN, timeout=10)
    agent.wait_for(r"HTTP 403 NODE_DISABLED on POST /api/v1/agent/heartbeat: an operator disabled this node")
    assert agent.process.poll() is None
    requests.post(f"{agent_server.url}/api/v1/admin/nodes/{node_id}/enable", headers=ADMIN, timeout=10)
    agent.wait_for(r"publishing again", timeout=25)
    assert agent.log().count("an operator disabled this node") == 1
    agent.stop()


SCENARIO = fake_nvml_scenario({**FAKE_RTX_4080, "errors": {"power": "NVMLError_NotSupported"}})


def test_nvidia_mode_publishes_measured_gpus_and_telemetry(agent_server, tmp_path):
    agent, _ = nvidia_agent(tmp_path, agent_server, SCENARIO)
    assert agent.run("--once") == 0, agent.log()
    current = node(agent_server, agent.node_id())
    (gpu,) = current["gpus"]
    assert gpu["uuid"] == "GPU-5f3b2c1a-0000-4000-8000-000000004080"
    assert (gpu["name"], gpu["memory_total_bytes"], gpu["driver_version"]) == (
        "NVIDIA GeForce RTX 4080",
        17171480576,
        "550.54.14",
    )
    assert (gpu["cuda_driver_version"], gpu["pci_bus_id"]) == ("12.4", "00000000:01:00.0")
    (sample,) = current["telemetry"]
    assert sample["utilization_gpu_percent"] == 7.0 and sample["memory_used_bytes"] == 734003200
    assert sample["temperature_c"] == 38.0 and sample["power_w"] is None  # NotSupported stays null
    assert current["health"]["status"] == "ok"  # a sensor the GPU lacks is not a fault


def test_failed_preflight_exits_3_and_sends_and_writes_nothing(agent_server, tmp_path):
    agent, minted = nvidia_agent(tmp_path, agent_server, json.dumps({"init_error": "NVMLError_LibraryNotFound"}))
    assert agent.run() == 3
    lines = [line for line in agent.log().splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("NVIDIA_NVML_UNAVAILABLE: NVMLError_LibraryNotFound")
    codes = re.findall(r"NVIDIA_[A-Z_]+", agent.log())
    assert set(codes) == {"NVIDIA_NVML_UNAVAILABLE"}
    assert list(agent.state_dir.iterdir()) == []
    pending = requests.get(
        f"{agent_server.url}/api/v1/admin/node-enrollments/{minted['id']}", headers=ADMIN, timeout=10
    ).json()
    assert pending["state"] == "pending"
    agent_server.stop()
    assert "/api/v1/agent/" not in agent_server.log()


def test_preflight_flag_reports_and_never_touches_network_or_state(tmp_path):
    # An address nothing listens on: any network use would show up as a ConnectError line.
    agent = AgentProcess(tmp_path, "http://127.0.0.1:9", MODELFORGE_AGENT_ACCELERATOR_MODE="nvidia")
    agent.with_fake_nvml(SCENARIO)
    assert agent.run("--preflight") == 0
    report = agent.log()
    assert "result: PASS" in report and "GPU-5f3b2c1a-0000-4000-8000-000000004080" in report
    assert "ConnectError" not in report and list(agent.state_dir.iterdir()) == []

    broken = AgentProcess(tmp_path, "", "broken", MODELFORGE_AGENT_ACCELERATOR_MODE="nvidia")
    broken.with_fake_nvml(json.dumps({"gpus": []}))
    assert broken.run("--preflight") == 3
    assert "FAIL NVIDIA_DEVICE_NOT_FOUND" in broken.log()


def test_sigterm_during_backoff_ends_within_a_second(tmp_path):
    agent = AgentProcess(tmp_path, "http://127.0.0.1:9", MODELFORGE_AGENT_ENROLLMENT_TOKEN="mfe_" + "t" * 43)
    agent.start()
    agent.wait_for(r"ConnectError on POST /api/v1/agent/enroll \(backoff 1s…16s\); next try in 4s", timeout=20)
    assert agent.stop() < 1.0
    assert agent.process.returncode == 0
    assert "t" * 43 not in agent.log()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://modelforge.example.internal:8000"}, "example placeholder"),
        ({"MODELFORGE_AGENT_ACCELERATOR_MODE": "tpu"}, "MODELFORGE_AGENT_ACCELERATOR_MODE"),
    ],
)
def test_configuration_errors_exit_2_with_one_line(tmp_path, env, message):
    agent = AgentProcess(tmp_path, "http://127.0.0.1:9", **env)
    assert agent.run() == 2
    (line,) = agent.log().strip().splitlines()
    assert line.startswith("modelforge-node-agent: configuration error:") and message in line


def test_tls_verify_false_warns_on_every_start(tmp_path, agent_server):
    minted = mint_token(agent_server.url)
    agent = AgentProcess(
        tmp_path,
        agent_server.url,
        MODELFORGE_AGENT_TLS_VERIFY="false",
        MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"],
    )
    for _ in range(2):
        assert agent.run("--once") == 0
    assert agent.log().count("MODELFORGE_AGENT_TLS_VERIFY=false: the control plane's certificate is NOT verified") == 2


def test_the_agent_at_its_cadence_never_meets_the_per_node_rate(sqlite_template, tmp_path):
    """A2: with the per-node rate on, the real agent's start-up (inventory then heartbeat), its
    beats at the interval and a restart are all accepted: not one 429, and the node stays online."""
    with gunicorn_on_sqlite_copy(
        sqlite_template,
        tmp_path / "rated.sqlite3",
        workers=2,
        MODELFORGE_HEARTBEAT_INTERVAL_SECONDS="1",
        MODELFORGE_NODE_RATE_LIMIT="on",
    ) as server:
        minted = mint_token(server.url)
        agent = AgentProcess(tmp_path, server.url, MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"]).start()
        agent.wait_for(r"inventory published")
        node_id = agent.node_id()
        wait_until(lambda: beats_accepted(server) >= 4, "four beats at the one-second interval", timeout=20)
        assert agent.stop() < 1.0
        restarted = AgentProcess(tmp_path, server.url).start()  # at once: inventory and beat again
        restarted.wait_for(r"inventory published")
        wait_until(lambda: beats_accepted(server) >= 6, "two beats more after the restart", timeout=20)
        assert node(server, node_id)["status"] == "online"
        assert restarted.stop() < 1.0
    accepted = re.findall(r'"POST /api/v1/agent/(heartbeat|inventory) HTTP/1.1" (\d+)', server.log())
    assert accepted.count(("inventory", "200")) == 2 and accepted.count(("heartbeat", "200")) >= 6
    assert {status for _, status in accepted} == {"200"}, str(accepted)  # never a 429
    assert "429" not in agent.log() + restarted.log()
