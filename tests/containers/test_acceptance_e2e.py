"""Acceptance evidence end to end (V1): the real agent, gunicorn, the runtime worker, podman and nginx.

The agent runs on the fake NVML with a stand-in `nvidia-smi` on its PATH — first one that disagrees
with NVML, then one that prints what the fake NVML knows. It is stopped until its node goes offline
and started again; a real `podman inspect` of an unhardened and of a hardened container is pasted;
a screenshot is uploaded through deploy/nginx/nginx.conf; a runtime.generate.v1 smoke test runs on
the real worker. The checklist fills item by item and the node is validated only at the end.
"""

from __future__ import annotations

import io
import json
import os
import struct
import time
import uuid
import zipfile
import zlib
from pathlib import Path

import pytest
import requests

from app.nodes import liveness
from tests.support import ADMIN, FAST_LIVENESS, GENERATE, JOB_LEASE_SECONDS, assert_no_secrets, factories, free_port
from tests.support.acquire import acquire, add_root, wait_job
from tests.support.agent import FAKE_RTX_4080, AgentProcess, fake_nvml_scenario, mint_token
from tests.support.containers import RUNTIME_BASE, ensure_bases, podman
from tests.support.gunicorn import gunicorn_on_sqlite_copy
from tests.support.nginx import NGINX, DeployNginx
from tests.support.serving import create, start_worker, wait_capabilities  # noqa: F401

FAST = {**FAST_LIVENESS, "MODELFORGE_JOB_LEASE_SECONDS": str(JOB_LEASE_SECONDS)}
GPU = FAKE_RTX_4080
SCENARIO = fake_nvml_scenario(GPU)
# What nvidia-smi prints for the fake NVML's GPU, and a driver that disagrees with it.
AGREEING = f"{GPU['name']}, {GPU['uuid']}, 550.54.14, {GPU['memory_total'] // 2**20} MiB"
DISAGREEING = f"{GPU['name']}, {GPU['uuid']}, 535.104.05, {GPU['memory_total'] // 2**20} MiB"
INSPECT_SECRET = "mfe_EnvSecretInThePastedInspect0123456789"
HUB_SECRET = "hf_AnotherPastedSecretValue0123456789"


def nvidia_smi_on_path(directory: Path, line: str) -> str:
    """A PATH whose nvidia-smi answers the agent's query (and only it) with `line`."""
    directory.mkdir(parents=True)
    script = directory / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "--query-gpu=name,uuid,driver_version,memory.total" ] && [ "$2" = "--format=csv,noheader" ] '
        '|| { echo "unexpected arguments: $*" >&2; exit 2; }\n'
        f"printf '%s\\n' '{line}'\n"
    )
    script.chmod(0o755)
    return f"{directory}:{os.environ.get('PATH', '/usr/bin:/bin')}"


def png(width: int = 64, height: int = 48) -> bytes:
    """A real RGB PNG (a gradient), as a browser's screenshot would be."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\x00" + b"".join(bytes([x * 4, y * 5, 128]) for x in range(width)) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def api(base: str, method: str, path: str, **kwargs) -> requests.Response:
    return requests.request(method, base + path, headers={**ADMIN, **kwargs.pop("headers", {})}, timeout=30, **kwargs)


def checklist(base: str, node_id: str) -> dict:
    response = api(base, "GET", f"/api/v1/admin/nodes/{node_id}/acceptance")
    assert response.status_code == 200, response.text
    return response.json()


def states(base: str, node_id: str) -> dict[str, str]:
    return {item["name"]: item["state"] for item in checklist(base, node_id)["items"]}


def wait_states(base: str, node_id: str, timeout: float = 30, **wanted: str) -> dict[str, str]:
    """Poll the checklist until these items are in these states."""
    deadline = time.monotonic() + timeout
    seen = {}
    while time.monotonic() < deadline:
        seen = states(base, node_id)
        if all(seen[name] == state for name, state in wanted.items()):
            return seen
        time.sleep(0.3)
    raise AssertionError(f"the checklist never reached {wanted}: {seen}")


# L1: a node silent since before the control plane last could not hear (a sweep that failed on a
# busy box) is judged only after the hold, and a sweep that runs late (or after a hold) records
# node.offline straight from online, with no node.stale: what always comes is node.offline.
SILENCE_JUDGED_WITHIN = liveness.AGENT_LONGEST_BACKOFF_SECONDS + liveness.AGENT_LONGEST_REQUEST_SECONDS + 30


def wait_action(base: str, node_id: str, action: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = api(base, "GET", "/api/v1/admin/audit-events", params={"node_id": node_id}).json()["audit_events"]
        if any(event["action"] == action for event in events):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {action} for {node_id} within {timeout}s")


def eligibility(base: str, node_id: str, value: bool) -> requests.Response:
    return api(
        base, "POST", f"/api/v1/admin/nodes/{node_id}/production-eligibility", json={"production_eligible": value}
    )


def upload(base: str, node_id: str, data: bytes, name: str = "checklist.png") -> requests.Response:
    return api(
        base, "POST", f"/api/v1/admin/nodes/{node_id}/acceptance/screenshots", files={"file": (name, data, "image/png")}
    )


def paste(base: str, node_id: str, text: str) -> requests.Response:
    return api(base, "POST", f"/api/v1/admin/nodes/{node_id}/acceptance/container-status", json={"inspect": text})


class Containers:
    """podman containers made from the test base image, removed however the test ends."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def run(self, *flags: str) -> str:
        name = f"modelforge-acceptance-{uuid.uuid4().hex[:8]}"
        podman("run", "-d", "--name", name, *flags, RUNTIME_BASE, "sleep", "600")
        self.names.append(name)
        return podman("inspect", name).stdout

    def remove(self) -> None:
        for name in self.names:
            podman("rm", "-f", "-t", "0", name, check=False)


@pytest.fixture
def containers():
    ensure_bases()  # skips where there is no container engine; reuses tests/containers/test_containers.py's base
    made = Containers()
    yield made
    made.remove()


@pytest.fixture
def acceptance_server(sqlite_template, tmp_path):
    """gunicorn with fast liveness on SQLite, and deploy/nginx/nginx.conf in front where nginx is installed."""
    database = tmp_path / "acceptance.sqlite3"
    with gunicorn_on_sqlite_copy(sqlite_template, database, workers=2, **FAST) as server:
        proxy = None
        if NGINX is not None:
            (tmp_path / "nginx").mkdir()
            proxy = DeployNginx(tmp_path / "nginx", server.port)
        yield server, proxy, database
        if proxy is not None:
            proxy.stop()


def stored_bytes(database: Path, instance: Path) -> bytes:
    """The SQLite file with its WAL, and every file acceptance wrote under the instance path."""
    found = b"".join(path.read_bytes() for path in database.parent.glob(database.name + "*") if path.is_file())
    return found + b"".join(path.read_bytes() for path in (instance / "acceptance").rglob("*") if path.is_file())


def test_the_checklist_fills_item_by_item_and_the_node_validates_only_at_the_end(
    acceptance_server,
    containers,
    tmp_path,
    socket_dir,
    hub,
    model_repo,  # noqa: F811
):
    server, proxy, database = acceptance_server
    base = server.url
    artifacts = tmp_path / "agent" / "artifacts"
    artifacts.mkdir(parents=True)
    worker = start_worker(socket_dir / "worker.sock", artifacts, tmp_path / "worker")
    agents: list[AgentProcess] = []

    def agent(path_with_smi: str, **env: str) -> AgentProcess:
        started = AgentProcess(
            tmp_path,
            base,
            MODELFORGE_AGENT_ACCELERATOR_MODE="nvidia",
            MODELFORGE_AGENT_WORKER_SOCKET=str(worker.socket_path),
            HF_ENDPOINT=hub.url,
            PATH=path_with_smi,
            **env,
        ).with_fake_nvml(SCENARIO)
        agents.append(started.start())
        return started

    try:
        # 1. An agent whose nvidia-smi disagrees with NVML: GPU facts contradicted, never a pass.
        first = agent(
            nvidia_smi_on_path(tmp_path / "disagreeing", DISAGREEING),
            MODELFORGE_AGENT_ENROLLMENT_TOKEN=mint_token(base)["token"],
        )
        first.wait_for(r"inventory published")
        node_id = first.node_id()
        seen = wait_states(base, node_id, gpu_facts="contradicted", node_api_output="observed")
        assert seen == {**dict.fromkeys(seen, "missing"), "gpu_facts": "contradicted", "node_api_output": "observed"}
        gpu_facts = next(item for item in checklist(base, node_id)["items"] if item["name"] == "gpu_facts")
        assert "535.104.05" in gpu_facts["detail"] and gpu_facts["evidence"]["output"].strip() == DISAGREEING
        refused = eligibility(base, node_id, True)
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "NODE_NOT_VALIDATED"
        assert refused.json()["contradicted"] == ["gpu_facts"] and "restart_identity" in refused.json()["missing"]

        # 2. Stopped until offline, started again with an nvidia-smi that agrees: three items at once.
        first.stop()
        try:
            wait_action(base, node_id, "node.offline", SILENCE_JUDGED_WITHIN)
        except AssertionError as missing:  # say what the server (and its scheduler) said meanwhile
            said = [line for line in server.log().splitlines() if '"GET /api/v1/admin/audit-events' not in line]
            raise AssertionError(f"{missing}; the server's last words:\n" + "\n".join(said[-80:])) from None
        assert states(base, node_id)["recovery"] == "missing"  # offline, not yet returned
        second = agent(nvidia_smi_on_path(tmp_path / "agreeing", AGREEING))
        second.wait_for(r"starting with its stored credential|inventory published")
        assert second.node_id() == node_id
        seen = wait_states(base, node_id, gpu_facts="observed", restart_identity="observed", recovery="observed")
        assert {name for name, state in seen.items() if state == "missing"} == {
            "container_status",
            "runtime_smoke_test",
            "screenshots",
        }
        identity = next(item for item in checklist(base, node_id)["items"] if item["name"] == "restart_identity")
        before, after = identity["evidence"]["before"], identity["evidence"]["after"]
        assert before["node_id"] == after["node_id"] == node_id and before["gpu_uuids"] == after["gpu_uuids"] == [
            GPU["uuid"]
        ]
        assert before["start_id"] != after["start_id"]

        # 3. A runtime.generate.v1 smoke test on the real worker.
        (artifacts / "registry").mkdir()
        root = add_root(server, node_id, artifacts / "registry")
        acquired = wait_job(
            server, acquire(server, node_id, root["id"], repo_id=model_repo)["id"], {"succeeded", "failed"}
        )
        assert acquired["state"] == "succeeded", acquired
        wait_capabilities(server, node_id, {GENERATE})
        artifact_id = acquired["result"]["artifact_id"]
        smoke = create(
            server,
            GENERATE,
            node_id,
            artifact_id=artifact_id,
            model_file="tiny.gguf",
            prompts=["Once upon a time"],
            max_tokens=8,
        )
        assert wait_job(server, smoke["id"], {"succeeded", "failed"}, timeout=120)["state"] == "succeeded"
        smoke_item = next(item for item in checklist(base, node_id)["items"] if item["name"] == "runtime_smoke_test")
        assert smoke_item["state"] == "observed" and smoke_item["source"] == f"job {smoke['id']}"

        # 4. A real podman inspect: an unhardened container is contradicted, a hardened one observed.
        unhardened = containers.run("-p", f"127.0.0.1:{free_port()}:80")
        soft = paste(base, node_id, unhardened)
        assert soft.status_code == 201 and soft.json()["state"] == "contradicted", soft.text
        assert set(soft.json()["evidence"]["failed"]) == {
            "restart_policy",
            "read_only_root",
            "capabilities_dropped",
            "no_new_privileges",
            "no_published_ports",
        }
        hardened = containers.run(
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--restart",
            "unless-stopped",
            "-e",
            f"MODELFORGE_AGENT_ENROLLMENT_TOKEN={INSPECT_SECRET}",
            "-e",
            f"MODELFORGE_HF_TOKEN={HUB_SECRET}",
        )
        assert INSPECT_SECRET in hardened  # the paste really carries it
        hard = paste(base, node_id, hardened)
        assert hard.status_code == 201 and hard.json()["state"] == "observed", hard.json()["evidence"]["checks"]
        assert hard.json()["evidence"]["container"]["engine"] == "podman"
        assert "MODELFORGE_AGENT_ENROLLMENT_TOKEN" in hard.json()["evidence"]["container"]["env_names"]
        assert not checklist(base, node_id)["validated"]  # one item still missing

        # 5. A screenshot through the deploy proxy (its body limit lets 5 MiB through); validated at last.
        upload_base = proxy.url if proxy is not None else base
        shot = upload(upload_base, node_id, png())
        assert shot.status_code == 201, shot.text
        final = checklist(base, node_id)
        assert final["validated"] is True, final
        assert all(item["observed_at"] for item in final["items"])

        # 6. Now production eligibility is accepted, and the bundle carries everything.
        accepted = eligibility(base, node_id, True)
        assert accepted.status_code == 200 and accepted.json()["production_eligible"] is True
        bundle = api(base, "GET", f"/api/v1/admin/nodes/{node_id}/acceptance/export")
        assert bundle.status_code == 200 and bundle.headers["Content-Type"] == "application/zip"
        archive = zipfile.ZipFile(io.BytesIO(bundle.content))
        report = json.loads(archive.read("report.json"))
        assert report["checklist"]["validated"] is True and report["checklist"]["production_eligible"] is True
        assert archive.read(report["screenshots"][0]["file"]) == png()

        # 7. A later contradiction: an agent whose nvidia-smi disagrees again clears the flag.
        second.stop()
        third = agent(nvidia_smi_on_path(tmp_path / "disagreeing-again", DISAGREEING))
        third.wait_for(r"inventory published")
        wait_states(base, node_id, gpu_facts="contradicted")
        after = checklist(base, node_id)
        assert after["validated"] is False and after["production_eligible"] is False
        wait_action(base, node_id, "node.production_eligibility_cleared")

        # P2: the pasted secrets and the node credential are nowhere the control plane keeps or logs.
        kept = stored_bytes(database, tmp_path)  # GunicornServer's instance path is tmp_path
        for secret in (INSPECT_SECRET, HUB_SECRET, first.credential()):
            assert secret.encode() not in kept
        logs = server.log() + "".join(started.log() for started in agents)
        assert_no_secrets(logs, INSPECT_SECRET, HUB_SECRET, first.credential())
    finally:
        for started in agents:
            if started.process and started.process.poll() is None:
                started.process.kill()
                started.process.wait()
        worker.kill()


def test_hostile_acceptance_input_gets_clear_errors_and_stores_nothing(acceptance_server, tmp_path):
    server, proxy, database = acceptance_server
    base = server.url
    minted = mint_token(base)
    enrolled = requests.post(
        base + "/api/v1/agent/enroll", json=factories.enroll_body(minted["token"], origin=base), timeout=10
    ).json()
    node_id = enrolled["node_id"]
    before_checklist = checklist(base, node_id)
    before_stored = stored_bytes(database, tmp_path)

    for target in [base] + ([proxy.url] if proxy is not None else []):
        huge = upload(target, node_id, png() + b"\x00" * (20 * 2**20))
        assert huge.status_code == 413, (target, huge.text)
        assert huge.json()["error"]["code"] in ("SCREENSHOT_TOO_LARGE", "REQUEST_TOO_LARGE")
    assert upload(base, node_id, png() + b"\x00" * (20 * 2**20)).json()["error"]["code"] == "SCREENSHOT_TOO_LARGE"
    fake = upload(base, node_id, b"#!/bin/sh\necho not an image\n" * 10, name="screenshot.png")
    assert fake.status_code == 400 and fake.json()["error"]["code"] == "SCREENSHOT_NOT_IMAGE"
    malformed = paste(base, node_id, '[{"Id": "abc", "State": {"Running": tru')
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "INSPECT_INVALID"
    assert "not valid JSON" in malformed.json()["error"]["message"]
    not_json = api(
        base,
        "POST",
        f"/api/v1/admin/nodes/{node_id}/acceptance/container-status",
        data="{inspect:",
        headers={"Content-Type": "application/json"},
    )
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "MALFORMED_JSON"

    assert checklist(base, node_id) == before_checklist
    assert stored_bytes(database, tmp_path).count(b"screenshot") == before_stored.count(b"screenshot")
    assert not (tmp_path / "acceptance").exists() or not any((tmp_path / "acceptance").rglob("*.png"))

    # An inspect with secrets in Env is kept without them.
    secret_env = json.dumps(
        [
            {
                "Id": "c0ffee" * 10,
                "Name": "node-agent",
                "State": {"Status": "running", "Running": True},
                "Config": {
                    "Image": "modelforge-node-agent:local",
                    "Env": [f"MODELFORGE_AGENT_ENROLLMENT_TOKEN={INSPECT_SECRET}", f"MODELFORGE_HF_TOKEN={HUB_SECRET}"],
                },
                "Args": ["--token", INSPECT_SECRET],
                "HostConfig": {
                    "RestartPolicy": {"Name": "always"},
                    "ReadonlyRootfs": True,
                    "CapDrop": ["ALL"],
                    "SecurityOpt": ["no-new-privileges"],
                },
            }
        ]
    )
    kept = paste(base, node_id, secret_env)
    assert kept.status_code == 201 and kept.json()["state"] == "observed", kept.text
    assert INSPECT_SECRET not in kept.text and HUB_SECRET not in kept.text
    stored = stored_bytes(database, tmp_path)
    assert INSPECT_SECRET.encode() not in stored and HUB_SECRET.encode() not in stored
    assert_no_secrets(server.log(), INSPECT_SECRET, HUB_SECRET, enrolled["credential"])
