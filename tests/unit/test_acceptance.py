"""Acceptance evidence (V1): the checklist fills item by item, and only a validated node may be production eligible.

Through the admin API on SQLite and PostgreSQL; the end-to-end run with the real agent, nvidia-smi
stand-ins, a real podman inspect and gunicorn is tests/containers/test_acceptance_e2e.py.
"""

from __future__ import annotations

import io
import json
import struct
import threading
import time
import uuid
import zipfile
import zlib
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from app import acceptance
from app.acceptance import uploads
from app.config import current_settings
from app.extensions import db
from app.jobs import runtime
from app.models import AcceptanceEvidence, AcceptanceScreenshot, AuditEvent, Job, Node
from app.nodes import liveness
from app.timeutil import utcnow
from tests.support import ADMIN, SECRET_PATTERN, factories
from tests.support.acceptance import jpeg

GPU_A = "GPU-00000000-0000-0000-0000-000000000001"
GPU_B = "GPU-00000000-0000-0000-0000-00000000000b"
ITEM_NAMES = [name for name, _ in acceptance.ITEMS]


# --------------------------------------------------------------------------- helpers


def smi_line(gpu: dict[str, object]) -> str:
    """What nvidia-smi prints for one GPU the agent's NVML reported."""
    return f"{gpu['name']}, {gpu['uuid']}, {gpu['driver_version']}, {gpu['memory_total_bytes'] // 2**20} MiB"


def publish(client, credential: str, gpus=None, smi="agree", start_id: str | None = None, **facts) -> None:
    """Send an inventory as the agent does: NVML's GPUs, nvidia-smi's output, this run's start id."""
    gpus = [factories.gpu()] if gpus is None else gpus
    if smi == "agree":
        facts["nvidia_smi"] = {"output": "".join(smi_line(gpu) + "\n" for gpu in gpus), "exit_status": 0}
    elif smi is not None:
        facts["nvidia_smi"] = smi
    if start_id is not None:
        facts["agent"] = {"version": "0.1.0", "start_id": start_id, "started_at": factories.sample()["sampled_at"]}
    response = client.post(
        "/api/v1/agent/inventory", json=factories.inventory_body(gpus, **facts), headers=factories.bearer(credential)
    )
    assert response.status_code == 200, response.get_json()


def beat(client, credential: str) -> None:
    response = client.post(
        "/api/v1/agent/heartbeat", json=factories.heartbeat_body(), headers=factories.bearer(credential)
    )
    assert response.status_code == 200, response.get_json()


def checklist(client, node_id: str) -> dict[str, object]:
    response = client.get(f"/api/v1/admin/nodes/{node_id}/acceptance", headers=ADMIN)
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def states(client, node_id: str) -> dict[str, str]:
    return {item["name"]: item["state"] for item in checklist(client, node_id)["items"]}


def item(client, node_id: str, name: str) -> dict[str, object]:
    return next(entry for entry in checklist(client, node_id)["items"] if entry["name"] == name)


def png(width: int = 4, height: int = 3) -> bytes:
    """A real, minimal RGB PNG."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\x00" + b"\x80\x20\x20" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def multipart(data: bytes, name: str, content_type: str, field: str = "file") -> tuple[bytes, str]:
    """A multipart/form-data body with one file part, as a browser sends it."""
    boundary = "modelforge-test-" + uuid.uuid4().hex
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{name}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n"
    )
    body = head.encode("utf-8", "surrogateescape") + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def upload(client, node_id: str, data: bytes, name: str = "nodes.png", content_type: str = "image/png", field="file"):
    body, header = multipart(data, name, content_type, field)
    return client.post(
        f"/api/v1/admin/nodes/{node_id}/acceptance/screenshots", data=body, headers={**ADMIN, "Content-Type": header}
    )


def docker_inspect(**changes: object) -> list[dict[str, object]]:
    """`docker inspect` of the node-agent container as deploy/docker-compose.node-agent.yml starts it."""
    document = {
        "Id": "4f1c" * 16,
        "Name": "/deploy-node-agent-1",
        "Image": "sha256:" + "ab" * 32,
        "State": {"Status": "running", "Running": True, "StartedAt": "2026-12-01T00:00:00Z"},
        "RestartCount": 0,
        "Config": {
            "Image": "modelforge-node-agent:local",
            "Env": [
                "MODELFORGE_AGENT_CONTROL_PLANE_URL=https://cp.example",
                "MODELFORGE_AGENT_ENROLLMENT_TOKEN=mfe_PasteSecretTokenValue1234567890",
                "MODELFORGE_HF_TOKEN=hf_PasteSecretHubTokenValue987654321",
                "PATH=/usr/local/bin:/usr/bin:/bin",
            ],
            "Labels": {"com.docker.compose.service": "node-agent", "vendor.api-token": "lbl-secret-value-42"},
            "Cmd": ["--token", "mfe_PasteSecretTokenValue1234567890"],
        },
        "Args": ["--token", "mfe_PasteSecretTokenValue1234567890"],
        "HostConfig": {
            "RestartPolicy": {"Name": "unless-stopped", "MaximumRetryCount": 0},
            "ReadonlyRootfs": True,
            "CapAdd": None,
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges:true"],
            "Privileged": False,
            "NetworkMode": "deploy_default",
            "PortBindings": {},
            "Binds": None,
        },
        "Mounts": [
            {"Type": "volume", "Source": "/var/lib/docker/volumes/state", "Destination": "/data/state", "RW": True}
        ],
        "NetworkSettings": {"Ports": {}},
    }
    for dotted, value in changes.items():
        target = document
        *parents, last = dotted.split("__")
        for parent in parents:
            target = target[parent]
        target[last] = value
    return [document]


def paste(client, node_id: str, text: str):
    return client.post(
        f"/api/v1/admin/nodes/{node_id}/acceptance/container-status", json={"inspect": text}, headers=ADMIN
    )


def go_stale_offline_and_return(app, client, credential: str) -> None:
    """L1 through the real sweep: silent past stale, then past offline, then a heartbeat brings it back."""
    with app.app_context():
        settings = current_settings(app)
        later = utcnow() + timedelta(seconds=settings.node_stale_after_seconds + 1)
        assert liveness.sweep(settings, later)["stale"] == 1
        assert liveness.sweep(settings, later + timedelta(seconds=settings.node_offline_after_seconds))["offline"] == 1
    beat(client, credential)


def complete_smoke_test(app, node_id: str) -> str:
    """A succeeded runtime.generate.v1 on this node, as the job API leaves it (W2)."""
    with app.app_context():
        job = Job(
            type=runtime.GENERATE,
            node_id=node_id,
            params={"prompts": ["Say hello"], "max_tokens": 8},
            state="succeeded",
            attempt=1,
            result={"model_file": "tiny.gguf", "outputs": [{"prompt": "Say hello", "text": " Hello there"}]},
            started_at=utcnow(),
            finished_at=utcnow(),
        )
        db.session.add(job)
        db.session.commit()
        return job.id


def snapshot(app) -> tuple:
    """What acceptance keeps: rows and files, to show a refusal stored nothing."""
    with app.app_context():
        rows = (
            db.session.scalar(sa.select(sa.func.count()).select_from(AcceptanceEvidence)),
            db.session.scalar(sa.select(sa.func.count()).select_from(AcceptanceScreenshot)),
            db.session.scalar(
                sa.select(sa.func.count()).select_from(AuditEvent).where(AuditEvent.action.like("node.acceptance%"))
            ),
        )
        folder = Path(current_settings(app).instance_path) / "acceptance"
        files = sorted(str(path) for path in folder.rglob("*")) if folder.exists() else []
    return rows, files


@pytest.fixture
def node(client):
    """An enrolled node whose agent has published nothing yet."""
    return factories.enrolled_node(client)


# --------------------------------------------------------------------------- the checklist


def test_a_new_node_has_every_item_missing_each_saying_how_to_get_it(client, node):
    body = checklist(client, node["node_id"])
    assert body["node_id"] == node["node_id"]
    assert body["validated"] is False and body["production_eligible"] is False
    assert [entry["name"] for entry in body["items"]] == ITEM_NAMES
    assert [entry["title"] for entry in body["items"]] == [title for _, title in acceptance.ITEMS]
    for entry in body["items"]:
        assert entry["state"] == "missing" and entry["observed_at"] is None and entry["detail"], entry
    container = next(entry for entry in body["items"] if entry["name"] == "container_status")
    assert acceptance.inspect_command(node["node_id"]) in container["detail"]
    assert "docker compose" in acceptance.inspect_command(node["node_id"])


def test_the_checklist_of_an_unknown_node_is_404(client):
    response = client.get(f"/api/v1/admin/nodes/{uuid.uuid4()}/acceptance", headers=ADMIN)
    assert response.status_code == 404 and response.get_json()["error"]["code"] == "NODE_NOT_FOUND"
    assert client.get(f"/api/v1/admin/nodes/{uuid.uuid4()}/acceptance").status_code == 401


def test_gpu_facts_are_observed_only_when_nvidia_smi_and_nvml_agree(client, node):
    node_id, credential = node["node_id"], node["credential"]
    publish(client, credential, smi=None)  # an agent that does not run nvidia-smi
    assert "did not report nvidia-smi" in item(client, node_id, "gpu_facts")["detail"]

    publish(client, credential, smi={"output": None, "problem": "nvidia-smi is not on PATH"})
    seen = item(client, node_id, "gpu_facts")
    assert seen["state"] == "missing" and "nvidia-smi is not on PATH" in seen["detail"]

    publish(client, credential)
    seen = item(client, node_id, "gpu_facts")
    assert seen["state"] == "observed" and seen["source"] == "agent inventory" and seen["observed_at"]
    assert GPU_A in [gpu["uuid"] for gpu in seen["evidence"]["nvidia_smi"]]
    assert "NVIDIA GeForce RTX 4080" in seen["detail"] and "550.54.14" in seen["detail"]

    wrong_driver = smi_line(factories.gpu(driver_version="535.0"))
    publish(client, credential, smi={"output": wrong_driver + "\n"})
    seen = item(client, node_id, "gpu_facts")
    assert seen["state"] == "contradicted" and "535.0" in seen["detail"]

    other_gpu = smi_line(factories.gpu(GPU_B))
    publish(client, credential, smi={"output": other_gpu})
    seen = item(client, node_id, "gpu_facts")
    assert seen["state"] == "contradicted" and GPU_A in seen["detail"] and GPU_B in seen["detail"]

    publish(client, credential, smi={"output": "Failed to initialize NVML: Driver/library version mismatch"})
    assert item(client, node_id, "gpu_facts")["state"] == "contradicted"


def test_memory_within_one_mib_agrees_and_beyond_it_does_not(client, node):
    node_id, credential = node["node_id"], node["credential"]
    total = factories.gpu()["memory_total_bytes"] // 2**20
    for shown, expected in ((total + 1, "observed"), (total - 1, "observed"), (total + 2, "contradicted")):
        line = f"NVIDIA GeForce RTX 4080, {GPU_A}, 550.54.14, {shown} MiB"
        publish(client, credential, smi={"output": line})
        assert item(client, node_id, "gpu_facts")["state"] == expected, shown


HUGE_MEMORY = "9" * 4301  # one digit past int()'s limit for text (sys.get_int_max_str_digits)


@pytest.mark.parametrize(
    "memory",
    [f"{HUGE_MEMORY} MiB", "99999999999999999999999 MiB", "[N/A]", "16376.5 MiB", "-16376 MiB", "١٦٣٧٦ MiB"],
    ids=["past-int-limit", "past-max-bytes", "not-available", "fraction", "negative", "arabic-digits"],
)
def test_an_unreadable_memory_field_is_never_agreement_and_never_a_500(app, client, node, memory):
    """P5: whatever nvidia-smi's memory.total holds, every page that reads it answers, and never "observed"."""
    node_id, credential = node["node_id"], node["credential"]
    publish(client, credential, smi={"output": f"NVIDIA GeForce RTX 4080, {GPU_A}, 550.54.14, {memory}\n"})
    seen = item(client, node_id, "gpu_facts")
    assert seen["state"] == "contradicted", seen
    assert "memory" in seen["detail"] and HUGE_MEMORY not in seen["detail"]
    assert client.get(f"/api/v1/admin/nodes/{node_id}/acceptance/export", headers=ADMIN).status_code == 200
    assert eligibility(client, node_id, True).status_code == 409
    assert client.get(f"/api/v1/hardware/nodes/{node_id}", headers=ADMIN).status_code == 200
    assert client.get("/api/v1/hardware/nodes", headers=ADMIN).status_code == 200


def test_an_eligible_node_whose_nvidia_smi_memory_turns_unreadable_loses_eligibility_not_its_inventory(
    app, client, node
):
    node_id, credential = node["node_id"], node["credential"]
    gather_everything(app, client, node)
    assert eligibility(client, node_id, True).status_code == 200
    huge = f"NVIDIA GeForce RTX 4080, {GPU_A}, 550.54.14, {HUGE_MEMORY} MiB\n"
    publish(client, credential, smi={"output": huge})  # asserts 200: the inventory is accepted
    result = checklist(client, node_id)
    assert result["validated"] is False and result["production_eligible"] is False
    with app.app_context():
        cleared = db.session.scalar(
            sa.select(AuditEvent).where(AuditEvent.action == "node.production_eligibility_cleared")
        )
        assert cleared is not None and "gpu_facts contradicted" in cleared.details["reasons"]


def test_restart_identity_is_recorded_when_the_agent_starts_again(client, node):
    node_id, credential = node["node_id"], node["credential"]
    publish(client, credential, start_id="a" * 32)
    publish(client, credential, start_id="a" * 32)  # the same run: no restart
    assert item(client, node_id, "restart_identity")["state"] == "missing"

    publish(client, credential, start_id="b" * 32)
    seen = item(client, node_id, "restart_identity")
    assert seen["state"] == "observed"
    assert seen["evidence"]["before"] == {
        **seen["evidence"]["before"],
        "node_id": node_id,
        "start_id": "a" * 32,
        "gpu_uuids": [GPU_A],
    }
    assert seen["evidence"]["after"]["start_id"] == "b" * 32 and seen["evidence"]["after"]["gpu_uuids"] == [GPU_A]

    publish(client, credential, gpus=[factories.gpu(GPU_B)], start_id="c" * 32)
    seen = item(client, node_id, "restart_identity")
    assert seen["state"] == "contradicted" and GPU_A in seen["detail"] and GPU_B in seen["detail"]


def test_the_node_api_output_is_captured_by_the_control_plane_without_secrets(app, client, node):
    node_id, credential = node["node_id"], node["credential"]
    publish(client, credential)
    seen = item(client, node_id, "node_api_output")
    assert seen["state"] == "observed" and seen["source"] == "control plane read-back"
    read_back = seen["evidence"]["read_back"]
    assert read_back["id"] == node_id and read_back["credential"]["prefix"] == credential[:10]
    stored = json.dumps(seen["evidence"])
    assert credential not in stored and node["token"] not in stored and not SECRET_PATTERN.search(stored)
    with app.app_context():
        from app.models import Credential

        digest = db.session.scalar(sa.select(Credential.token_hash).where(Credential.node_id == node_id))
    assert digest not in stored


def test_a_read_back_carrying_something_secret_is_contradicted_and_the_secret_not_stored(app, client, node):
    node_id, credential = node["node_id"], node["credential"]
    with app.app_context():
        db.session.get(Node, node_id).labels = {"note": "pasted " + credential}
        db.session.commit()
    publish(client, credential)
    seen = item(client, node_id, "node_api_output")
    assert seen["state"] == "contradicted" and "labels.note" in seen["detail"]
    assert credential not in json.dumps(seen)


def test_recovery_is_read_from_the_audit_trail_in_order(app, client, node):
    node_id, credential = node["node_id"], node["credential"]
    publish(client, credential)
    beat(client, credential)
    assert item(client, node_id, "recovery")["state"] == "missing"
    go_stale_offline_and_return(app, client, credential)
    seen = item(client, node_id, "recovery")
    assert seen["state"] == "observed" and seen["source"] == "audit trail"
    evidence = seen["evidence"]
    assert evidence["returned_at"] == seen["observed_at"] and evidence["stale_at"] and evidence["offline_at"]
    # In the order they happened (the sweep here ran with a clock moved ahead, so ids tell the order).
    assert evidence["audit_event_ids"] == sorted(evidence["audit_event_ids"])


def test_a_node_swept_offline_straight_from_online_has_recovered_too(app, client, node):
    """A late sweep sees the node past both limits at once (L1): no node.stale row, still an outage."""
    node_id, credential = node["node_id"], node["credential"]
    publish(client, credential)
    beat(client, credential)
    with app.app_context():
        settings = current_settings(app)
        later = utcnow() + timedelta(seconds=settings.node_offline_after_seconds + 1)
        assert liveness.sweep(settings, later) == {"stale": 0, "offline": 1}
    assert item(client, node_id, "recovery")["state"] == "missing"  # offline, not yet returned
    beat(client, credential)
    seen = item(client, node_id, "recovery")
    assert seen["state"] == "observed" and seen["evidence"]["stale_at"] is None
    assert "swept offline straight from online" in seen["detail"]
    assert len(seen["evidence"]["audit_event_ids"]) == 2


def test_the_smoke_test_is_the_latest_succeeded_generate_job(app, client, node):
    node_id = node["node_id"]
    assert "run a smoke test from the node page" in item(client, node_id, "runtime_smoke_test")["detail"]
    job_id = complete_smoke_test(app, node_id)
    seen = item(client, node_id, "runtime_smoke_test")
    assert seen["state"] == "observed" and seen["source"] == f"job {job_id}"
    assert seen["evidence"]["outputs"] == [{"prompt": "Say hello", "text": " Hello there"}]


# --------------------------------------------------------------------------- container status


def test_a_hardened_container_is_observed_and_no_environment_value_is_kept(app, client, node):
    node_id = node["node_id"]
    response = paste(client, node_id, json.dumps(docker_inspect(), indent=2))
    assert response.status_code == 201, response.get_json()
    body = response.get_json()
    assert body["state"] == "observed" and body["source"] == "operator paste", body
    assert {check["check"]: check["passed"] for check in body["evidence"]["checks"]} == {
        "running": True,
        "restart_policy": True,
        "read_only_root": True,
        "capabilities_dropped": True,
        "no_new_privileges": True,
        "not_privileged": True,
        "no_published_ports": True,
        "no_container_socket": True,
        "image": True,
    }
    container = body["evidence"]["container"]
    assert "MODELFORGE_AGENT_ENROLLMENT_TOKEN" in container["env_names"]
    assert container["labels"] == {"com.docker.compose.service": "node-agent", "vendor.api-token": "[removed]"}
    assert item(client, node_id, "container_status")["state"] == "observed"
    # P2: nothing of the pasted secrets anywhere in the database.
    dumped = dump_database(app)
    for secret in (
        "mfe_PasteSecretTokenValue1234567890",
        "hf_PasteSecretHubTokenValue987654321",
        "lbl-secret-value-42",
        "https://cp.example",
    ):
        assert secret not in dumped


def dump_database(app) -> str:
    """Every row of every table, as text, to grep for secrets."""
    with app.app_context():
        return "\n".join(
            repr(row) for table in db.metadata.sorted_tables for row in db.session.execute(sa.select(table)).all()
        )


@pytest.mark.parametrize(
    ("change", "failed"),
    [
        ({"State__Running": False, "State__Status": "exited"}, "running"),
        ({"HostConfig__RestartPolicy": {"Name": "no"}}, "restart_policy"),
        ({"HostConfig__ReadonlyRootfs": False}, "read_only_root"),
        ({"HostConfig__CapDrop": ["NET_RAW"]}, "capabilities_dropped"),
        ({"HostConfig__CapAdd": ["SYS_ADMIN"]}, "capabilities_dropped"),
        ({"HostConfig__SecurityOpt": []}, "no_new_privileges"),
        ({"HostConfig__Privileged": True}, "not_privileged"),
        ({"HostConfig__PortBindings": {"8080/tcp": [{"HostIp": "", "HostPort": "8080"}]}}, "no_published_ports"),
        ({"HostConfig__Binds": ["/var/run/docker.sock:/var/run/docker.sock"]}, "no_container_socket"),
        # A directory holding an engine's socket hands the socket over as well.
        ({"HostConfig__Binds": ["/var/run:/host/run:ro"]}, "no_container_socket"),
        ({"HostConfig__Binds": ["/run/:/host/run"]}, "no_container_socket"),
        ({"HostConfig__Binds": ["/run/podman:/run/podman"]}, "no_container_socket"),
        ({"HostConfig__Binds": ["/run/user/1000:/run/user/1000"]}, "no_container_socket"),
        ({"HostConfig__Binds": ["/:/host:ro"]}, "no_container_socket"),
        (
            {"Mounts": [{"Type": "bind", "Source": "/var/run/docker", "Destination": "/d", "RW": False}]},
            "no_container_socket",
        ),
        (
            {"Mounts": [{"Type": "bind", "Source": "/run/user/1000/podman", "Destination": "/p", "RW": True}]},
            "no_container_socket",
        ),
    ],
)
def test_each_missing_hardening_flag_contradicts_the_container_status(client, node, change, failed):
    response = paste(client, node["node_id"], json.dumps(docker_inspect(**change)))
    assert response.status_code == 201
    body = response.get_json()
    assert body["state"] == "contradicted" and body["evidence"]["failed"] == [failed]
    assert failed in body["detail"]


def test_unrelated_host_paths_are_not_taken_for_a_socket(client, node):
    binds = ["/srv/models:/models:ro", "/var/lib/modelforge:/data", "/run-data:/x", "/home/runner:/h"]
    response = paste(client, node["node_id"], json.dumps(docker_inspect(HostConfig__Binds=binds)))
    assert response.get_json()["state"] == "observed", response.get_json()["detail"]


def test_secrets_in_the_kept_projection_are_removed_too(app, client, node):
    """Label values, mount sources and the image name pass through the same scrub as the read-back (P2)."""
    node_id, credential = node["node_id"], node["credential"]
    with app.app_context():
        from app.models import Credential

        digest = db.session.scalar(sa.select(Credential.token_hash).where(Credential.node_id == node_id))
    operator_key = ADMIN["X-ModelForge-Admin-Token"]
    document = docker_inspect(
        Config__Image=f"registry.example/agent:{digest}",
        Config__Labels={"com.example.note": f"installed with {credential}", "owner": f"ops {operator_key}"},
        Mounts=[{"Type": "volume", "Source": f"/var/lib/{digest}/state", "Destination": "/data/state", "RW": True}],
    )
    response = paste(client, node_id, json.dumps(document))
    assert response.status_code == 201, response.get_json()
    container = response.get_json()["evidence"]["container"]
    assert container["labels"] == {"com.example.note": "[removed]", "owner": "[removed]"}
    assert container["image"] == "[removed]" and container["mounts"][0]["source"] == "[removed]"
    dumped = dump_database(app) + json.dumps(checklist(client, node_id))
    for secret in (credential, operator_key, f"/var/lib/{digest}", f"agent:{digest}"):
        assert secret not in dumped


PROVIDER_SECRETS = (
    "hf_" + "PasteLabelHubToken0123456789",
    "s3cretRegistryPassw0rd",
    "ghp_" + "B" * 36,
    "AKIA" + "IOSFODNN7EXAMPLE",
    "xoxb-" + "9876543210-zyxwvutsrq",
)


def test_provider_tokens_and_url_passwords_are_scrubbed_from_labels_image_and_mounts(app, client, node):
    """Issue 22 item 8: the same scrub as the env's, on what the projection keeps, in the evidence and the export."""
    node_id = node["node_id"]
    hub, password, github, aws, slack = PROVIDER_SECRETS
    document = docker_inspect(
        Config__Image=f"https://deploy:{password}@registry.example/modelforge-node-agent:1.3.0",
        Config__Labels={
            "com.docker.compose.service": "node-agent",
            "org.example.note": f"pulled with {hub}",
            "org.example.registry": f"https://ops:{password}@registry.example/",
            "org.example.ci": f"built by {github}",
            "org.example.cloud": aws,
            "org.example.chat": slack,
        },
        Mounts=[
            {"Type": "bind", "Source": f"/srv/{hub}/state", "Destination": "/data/state", "RW": True},
            {"Type": "volume", "Source": "/var/lib/docker/volumes/cache", "Destination": "/data/hf-cache", "RW": True},
        ],
    )
    response = paste(client, node_id, json.dumps(document))
    assert response.status_code == 201, response.get_json()
    container = response.get_json()["evidence"]["container"]
    assert container["labels"]["com.docker.compose.service"] == "node-agent"
    assert container["labels"]["org.example.note"] == "[removed]" and container["image"] == "[removed]"
    assert [mount["source"] for mount in container["mounts"]] == ["[removed]", "/var/lib/docker/volumes/cache"]
    exported = client.get(f"/api/v1/admin/nodes/{node_id}/acceptance/export", headers=ADMIN)
    bundle = zipfile.ZipFile(io.BytesIO(exported.data))
    everything = dump_database(app) + json.dumps(checklist(client, node_id))
    everything += "".join(bundle.read(name).decode() for name in ("report.json", "report.html"))
    for secret in PROVIDER_SECRETS:
        assert secret not in everything, secret


def test_the_image_must_be_the_one_a_release_enrolment_named(app, client, node):
    node_id = node["node_id"]
    release = {
        "kind": "release",
        "reference": "modelforge-node-agent:1.3.0",
        "release": {"tag": "modelforge-node-agent:1.3.0", "image_id": "sha256:" + "ab" * 32},
    }
    with app.app_context():
        from app.models import Enrollment

        db.session.execute(sa.update(Enrollment).where(Enrollment.node_id == node_id).values(agent_image=release))
        db.session.commit()
    wrong = paste(client, node_id, json.dumps(docker_inspect())).get_json()  # modelforge-node-agent:local
    assert wrong["state"] == "contradicted" and wrong["evidence"]["failed"] == ["image"]
    right = paste(client, node_id, json.dumps(docker_inspect(Config__Image="modelforge-node-agent:1.3.0"))).get_json()
    assert right["state"] == "observed", right["evidence"]["checks"]
    other_id = docker_inspect(Config__Image="modelforge-node-agent:1.3.0", Image="sha256:" + "cd" * 32)
    assert paste(client, node_id, json.dumps(other_id)).get_json()["evidence"]["failed"] == ["image"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "lists 0 containers"),
        (json.dumps(docker_inspect() * 2), "lists 2 containers"),
        ('"a string"', "not a JSON object"),
        (json.dumps({"Id": "x", "State": {}, "HostConfig": {}}), "no Config"),
        (
            json.dumps(
                [{"Id": "sha256:1", "RootFS": {}, "Architecture": "amd64", "Config": {}, "State": {}, "HostConfig": {}}]
            ),
            "an image",
        ),
    ],
)
def test_malformed_inspect_output_is_refused_and_stores_nothing(app, client, node, text, says):
    before = snapshot(app)
    response = paste(client, node["node_id"], text)
    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["code"] == "INSPECT_INVALID" and says in error["message"] and error["next_step"]
    assert snapshot(app) == before


def test_an_oversized_paste_or_body_is_refused(app, client, node):
    before = snapshot(app)
    too_long = paste(client, node["node_id"], " " * (acceptance.container.MAX_INSPECT_CHARS + 1))
    assert too_long.status_code == 400 and too_long.get_json()["error"]["field"] == "inspect"
    too_large = paste(client, node["node_id"], " " * (300 * 1024))
    assert too_large.status_code == 413 and too_large.get_json()["error"]["code"] == "REQUEST_TOO_LARGE"
    wrong_type = client.post(
        f"/api/v1/admin/nodes/{node['node_id']}/acceptance/container-status", data="{}", headers=ADMIN
    )
    assert wrong_type.status_code == 415
    assert snapshot(app) == before


# --------------------------------------------------------------------------- screenshots


@pytest.mark.parametrize(
    ("data", "content_type", "size"),
    [(png(), "image/png", (4, 3)), (jpeg(), "image/jpeg", (640, 480))],
    ids=["png", "jpeg"],
)
def test_a_screenshot_is_checked_by_its_bytes_stored_as_a_file_and_served_to_the_operator(
    app, client, node, data, content_type, size
):
    node_id = node["node_id"]
    response = upload(client, node_id, data, name="../../etc/passwd\x01 console.png", content_type="text/plain")
    assert response.status_code == 201, response.get_json()
    shot = response.get_json()
    assert shot["content_type"] == content_type and (shot["width"], shot["height"]) == size
    assert shot["size_bytes"] == len(data) and "/" not in shot["filename"] and "\x01" not in shot["filename"]
    stored = Path(current_settings(app).instance_path) / "acceptance" / node_id
    assert [path.name for path in stored.iterdir()] == [f"{shot['sha256']}.{uploads.EXTENSIONS[content_type]}"]
    served = client.get(f"/api/v1/admin/nodes/{node_id}/acceptance/screenshots/{shot['id']}", headers=ADMIN)
    assert served.status_code == 200 and served.data == data and served.mimetype == content_type
    assert served.headers["X-Content-Type-Options"] == "nosniff"
    served.close()
    assert client.get(f"/api/v1/admin/nodes/{node_id}/acceptance/screenshots/{shot['id']}").status_code == 401
    other = factories.enrolled_node(client)["node_id"]
    missing = client.get(f"/api/v1/admin/nodes/{other}/acceptance/screenshots/{shot['id']}", headers=ADMIN)
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "SCREENSHOT_NOT_FOUND"
    seen = item(client, node_id, "screenshots")
    assert seen["state"] == "observed" and seen["evidence"]["screenshots"][0]["sha256"] == shot["sha256"]
    # The same bytes again are kept once.
    assert upload(client, node_id, data).get_json()["id"] == shot["id"]
    with app.app_context():
        assert [kept.id for kept in acceptance.screenshots(node_id)] == [shot["id"]]


def test_the_same_bytes_uploaded_again_restore_a_missing_file(app, client, node):
    """A kept row whose file went missing (a restore without the instance folder) is made whole again."""
    node_id, data = node["node_id"], png(7, 7)
    shot = upload(client, node_id, data).get_json()
    path = Path(current_settings(app).instance_path) / "acceptance" / node_id / f"{shot['sha256']}.png"
    path.unlink()
    address = f"/api/v1/admin/nodes/{node_id}/acceptance/screenshots/{shot['id']}"
    assert client.get(address, headers=ADMIN).status_code == 404
    again = upload(client, node_id, data)
    assert again.status_code == 201 and again.get_json()["id"] == shot["id"]
    served = client.get(address, headers=ADMIN)
    assert served.status_code == 200 and served.data == data
    served.close()


@pytest.mark.parametrize("screenshot_id", [2**31, 2**63, 2**64 + 1, 10**30])
def test_a_screenshot_id_beyond_the_id_range_is_not_found(app, client, node, screenshot_id):
    """An id no row can have is 404, never an integer overflow in the driver (P5); OpenAPI says the bound."""
    assert upload(client, node["node_id"], png()).status_code == 201
    response = client.get(
        f"/api/v1/admin/nodes/{node['node_id']}/acceptance/screenshots/{screenshot_id}", headers=ADMIN
    )
    assert response.status_code == 404 and response.get_json()["error"]["code"] == "SCREENSHOT_NOT_FOUND"
    spec = client.get("/api/v1/openapi.json").get_json()
    parameters = spec["paths"]["/api/v1/admin/nodes/{node_id}/acceptance/screenshots/{screenshot_id}"]["parameters"]
    schema = next(parameter for parameter in parameters if parameter["name"] == "screenshot_id")["schema"]
    assert schema == {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "neither a PNG nor a JPEG"),
        (b"GIF89a" + b"\x00" * 100, "neither a PNG nor a JPEG"),
        (png()[:40], "cut short"),
        (png()[:-12] + png()[-12:-4] + b"\x00\x00\x00\x00", "checksum"),
        (png()[:-12], "no end"),
        (b"\xff\xd8\xff\xe0\x00\x02", "no frame header"),
        (png(0, 3), "dimensions"),
        (b"", "neither a PNG nor a JPEG"),
    ],
    ids=["svg", "gif", "cut-png", "bad-crc", "no-iend", "no-sof", "zero-width", "empty"],
)
def test_a_non_image_named_png_is_refused_and_stores_nothing(app, client, node, data, why):
    before = snapshot(app)
    response = upload(client, node["node_id"], data, name="screenshot.png")
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "SCREENSHOT_NOT_IMAGE" and why in error["message"]
    assert snapshot(app) == before


def png_claiming(width: int, height: int, pixels: bytes | None = b"\x00" * 64, kind: int = 2) -> bytes:
    """A well-formed PNG (every chunk and CRC right) whose header claims these dimensions, with this IDAT."""

    def chunk(name: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + name + body + struct.pack(">I", zlib.crc32(name + body))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, kind, 0, 0, 0))
    data = b"" if pixels is None else chunk(b"IDAT", zlib.compress(pixels) if pixels else b"not zlib")
    return b"\x89PNG\r\n\x1a\n" + header + data + chunk(b"IEND", b"")


def jpeg_without_image_data() -> bytes:
    """48 bytes that start and end like a JPEG, with a frame header and a scan header but nothing to decode."""
    frame = b"\xff\xc0\x00\x11\x08" + struct.pack(">HH", 480, 640) + b"\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    scan = b"\xff\xda\x00\x0c\x03\x01\x00\x02\x11\x03\x11\x00\x3f\x00" + b"\x12" * 11
    data = b"\xff\xd8" + frame + scan + b"\xff\xd9"
    assert len(data) == 48
    return data


def jpeg_claiming(width: int, height: int) -> bytes:
    """An 8×8 JPEG whose frame header claims other dimensions (its scan is then far too short)."""
    data = jpeg(8, 8)
    frame = data.index(b"\xff\xc0")
    return data[: frame + 5] + struct.pack(">HH", height, width) + data[frame + 9 :]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (png_claiming(20_000, 20_000), "dimensions 20000×20000"),
        (png_claiming(16_000, 16_000), "pixels"),
        (png_claiming(640, 480), "image data"),  # 64 bytes where 640×480 RGB rows need 922,080
        (png_claiming(4, 3, pixels=b""), "image data"),  # an IDAT that is not zlib
        (png_claiming(4, 3, pixels=None), "no image data"),
        (png_claiming(4, 3, pixels=b"\x07" + b"\x00" * 12 + b"\x00" * 26), "filter"),
        (png_claiming(4, 3, kind=5), "colour type"),
        (jpeg_without_image_data(), "JPEG"),
        (jpeg()[:-3400] + b"\xff\xd9", "image data"),  # a scan far too short for 640×480
        (jpeg_claiming(20_000, 20_000), "dimensions 20000×20000"),
        (jpeg() + b"trailing", "after its end"),
        (png() + b"<html>", "after its end"),
    ],
    ids=[
        "png-20000x20000",
        "png-256-megapixels",
        "png-too-little-data",
        "png-idat-not-zlib",
        "png-no-idat",
        "png-bad-filter",
        "png-bad-colour-type",
        "jpeg-48-bytes",
        "jpeg-short-scan",
        "jpeg-20000x20000",
        "jpeg-trailing-bytes",
        "png-trailing-bytes",
    ],
)
def test_an_image_that_is_not_decodable_or_too_large_to_decode_is_refused(app, client, node, data, why):
    """Issue 22 item 9: a screenshot is accepted only when its pixels are there, within the dimension caps."""
    before = snapshot(app)
    response = upload(client, node["node_id"], data, name="screenshot.png")
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "SCREENSHOT_NOT_IMAGE" and why in error["message"], error
    assert snapshot(app) == before


def test_the_largest_screenshot_the_caps_allow_is_accepted(client, node):
    """A tall full-page capture at the dimension cap, within the pixel cap, compressed under the byte limit."""
    height = uploads.MAX_DIMENSION
    width = uploads.MAX_PIXELS // height
    rows = (b"\x00" + b"\xff" * width) * height
    response = upload(client, node["node_id"], png_claiming(width, height, pixels=rows, kind=0))
    assert response.status_code == 201, response.get_json()
    assert (response.get_json()["width"], response.get_json()["height"]) == (width, height)


@pytest.mark.parametrize("size", [uploads.MAX_SCREENSHOT_BYTES + 1, 20 * 2**20])
def test_an_upload_over_the_limit_is_413_and_stores_nothing(app, client, node, size):
    before = snapshot(app)
    data = png()
    response = upload(client, node["node_id"], data + b"\x00" * (size - len(data)))
    assert response.status_code == 413
    error = response.get_json()["error"]
    assert error["code"] == "SCREENSHOT_TOO_LARGE" and str(uploads.MAX_SCREENSHOT_BYTES) in error["message"]
    assert snapshot(app) == before


def test_an_upload_without_a_file_field_or_not_multipart_is_refused(client, node):
    url = f"/api/v1/admin/nodes/{node['node_id']}/acceptance/screenshots"
    no_file = upload(client, node["node_id"], png(), field="other")
    assert no_file.status_code == 400 and no_file.get_json()["error"]["field"] == "file"
    assert client.post(url, json={"file": "x"}, headers=ADMIN).status_code == 415


def test_a_screenshot_just_under_the_limit_is_accepted(client, node):
    data = png(1, 1)
    # A PNG may carry ancillary chunks: pad one to reach the limit exactly.
    padding = uploads.MAX_SCREENSHOT_BYTES - len(data) - 12
    filler = b"teXt" + b"\x00" * padding
    big = data[:33] + struct.pack(">I", padding) + filler + struct.pack(">I", zlib.crc32(filler)) + data[33:]
    assert len(big) == uploads.MAX_SCREENSHOT_BYTES
    response = upload(client, node["node_id"], big)
    assert response.status_code == 201, response.get_json()


# --------------------------------------------------------------------------- the verdict


def gather_everything(app, client, node) -> None:
    """Every item observed, through the paths the agent and the operator use."""
    node_id, credential = node["node_id"], node["credential"]
    publish(client, credential, start_id="1" * 32)
    beat(client, credential)
    publish(client, credential, start_id="2" * 32)
    go_stale_offline_and_return(app, client, credential)
    complete_smoke_test(app, node_id)
    assert paste(client, node_id, json.dumps(docker_inspect())).status_code == 201
    assert upload(client, node_id, png()).status_code == 201


def eligibility(client, node_id: str, value: bool):
    return client.post(
        f"/api/v1/admin/nodes/{node_id}/production-eligibility", json={"production_eligible": value}, headers=ADMIN
    )


def test_production_eligible_is_refused_until_validated_and_audited_when_set(app, client, node):
    node_id = node["node_id"]
    refused = eligibility(client, node_id, True)
    assert refused.status_code == 409
    body = refused.get_json()
    assert body["error"]["code"] == "NODE_NOT_VALIDATED" and body["missing"] == ITEM_NAMES
    for name in ITEM_NAMES:
        assert name in body["error"]["message"]

    gather_everything(app, client, node)
    result = checklist(client, node_id)
    assert result["validated"] is True, [entry for entry in result["items"] if entry["state"] != "observed"]
    unknown = str(uuid.uuid4())
    with app.app_context():  # the nodes list's batch verdict agrees
        assert acceptance.verdicts([node_id, unknown]) == {node_id: True, unknown: False}

    accepted = eligibility(client, node_id, True)
    assert accepted.status_code == 200 and accepted.get_json()["production_eligible"] is True
    described = client.get(f"/api/v1/hardware/nodes/{node_id}", headers=ADMIN).get_json()
    assert described["eligibility"]["production_eligible"] is True
    with app.app_context():
        event = db.session.scalar(
            sa.select(AuditEvent).where(AuditEvent.action == "node.production_eligibility_changed")
        )
        assert event.actor == "operator" and event.details["new"] is True and event.details["gpu_uuids"] == [GPU_A]

    assert eligibility(client, node_id, False).get_json()["production_eligible"] is False
    assert eligibility(client, node_id, True).status_code == 200


@pytest.mark.parametrize(
    ("regression", "reason"),
    [
        ("gpus_changed", "GPU UUIDs changed"),
        ("nvidia_smi_disagrees", "gpu_facts contradicted"),
        ("nvidia_smi_gone", "gpu_facts missing"),
        ("container_unhardened", "container_status contradicted"),
        ("read_back_secret_at_upload", "node_api_output contradicted"),
        ("read_back_secret_at_paste", "node_api_output contradicted"),
    ],
)
def test_whatever_un_validates_the_node_clears_production_eligible_audited(app, client, node, regression, reason):
    """Any recording that leaves the node not validated clears the flag, with why, whichever item regressed."""
    node_id, credential = node["node_id"], node["credential"]
    gather_everything(app, client, node)
    assert eligibility(client, node_id, True).status_code == 200
    if regression.startswith("read_back_secret"):
        with app.app_context():  # the read-back now carries the node's credential
            db.session.get(Node, node_id).labels = {"note": "pasted " + credential}
            db.session.commit()
    if regression == "gpus_changed":
        publish(client, credential, gpus=[factories.gpu(GPU_B)], start_id="2" * 32)
    elif regression == "nvidia_smi_disagrees":
        publish(client, credential, smi={"output": smi_line(factories.gpu(name="NVIDIA RTX A6000"))}, start_id="2" * 32)
    elif regression == "nvidia_smi_gone":  # a restart without the NVIDIA container toolkit's nvidia-smi
        publish(client, credential, smi={"problem": "nvidia-smi not found"}, start_id="3" * 32)
    elif regression == "container_unhardened":
        paste(client, node_id, json.dumps(docker_inspect(HostConfig__ReadonlyRootfs=False)))
    elif regression == "read_back_secret_at_upload":
        assert upload(client, node_id, png(5, 5)).status_code == 201
    else:
        assert paste(client, node_id, json.dumps(docker_inspect())).status_code == 201
    result = checklist(client, node_id)
    assert result["validated"] is False and result["production_eligible"] is False
    with app.app_context():
        cleared = db.session.scalars(
            sa.select(AuditEvent).where(AuditEvent.action == "node.production_eligibility_cleared")
        ).all()
        assert len(cleared) == 1 and cleared[0].node_id == node_id and reason in cleared[0].details["reasons"]
    assert eligibility(client, node_id, True).status_code == 409


def test_an_inventory_waits_for_a_concurrent_mark_eligible_and_then_clears_it(app, client, node, database_url):
    """The node row is locked before the acceptance work, so the contradiction sees the committed flag."""
    node_id, credential = node["node_id"], node["credential"]
    gather_everything(app, client, node)
    other = sa.create_engine(database_url)
    inventory = threading.Thread(
        target=publish, args=(app.test_client(), credential), kwargs={"gpus": [factories.gpu(GPU_B)]}
    )
    try:
        with other.connect() as connection:  # another request marking the node eligible, not yet committed
            connection.execute(sa.select(Node.id).where(Node.id == node_id).with_for_update())
            connection.execute(sa.update(Node).where(Node.id == node_id).values(production_eligible=True))
            inventory.start()
            time.sleep(0.5)
            connection.commit()
        inventory.join(30)
    finally:
        other.dispose()
    assert not inventory.is_alive()
    assert checklist(client, node_id)["production_eligible"] is False
    with app.app_context():
        cleared = db.session.scalar(
            sa.select(AuditEvent).where(AuditEvent.action == "node.production_eligibility_cleared")
        )
        assert cleared is not None and "GPU UUIDs changed" in cleared.details["reasons"]


def test_the_nodes_list_verdict_costs_the_same_queries_for_one_node_or_many(app, client):
    ids = [factories.enrolled_node(client)["node_id"] for _ in range(5)]
    counted: list[str] = []
    with app.app_context():
        acceptance.verdicts(ids)  # the connection's own set-up statements are not the verdict's
        sa.event.listen(db.engine, "before_cursor_execute", lambda *args: counted.append(args[2]))
        assert acceptance.verdicts(ids[:1]) == {ids[0]: False}
        one = len(counted)
        counted.clear()
        assert acceptance.verdicts(ids) == dict.fromkeys(ids, False)
        assert len(counted) == one <= 8


# --------------------------------------------------------------------------- the bundle


def test_the_export_is_a_zip_with_the_json_report_a_self_contained_page_and_the_screenshots(app, client, node):
    node_id = node["node_id"]
    gather_everything(app, client, node)
    response = client.get(f"/api/v1/admin/nodes/{node_id}/acceptance/export", headers=ADMIN)
    assert response.status_code == 200 and response.mimetype == "application/zip"
    assert f"modelforge-acceptance-{node_id}-" in response.headers["Content-Disposition"]
    bundle = zipfile.ZipFile(io.BytesIO(response.data))
    shot = item(client, node_id, "screenshots")["evidence"]["screenshots"][0]
    assert sorted(bundle.namelist()) == ["report.html", "report.json", f"screenshots/{shot['sha256']}.png"]
    report = json.loads(bundle.read("report.json"))
    assert report["checklist"]["validated"] is True and report["generated_at"] and report["control_plane_version"]
    assert report["node"]["id"] == node_id and report["screenshots"][0]["file"].startswith("screenshots/")
    assert bundle.read(report["screenshots"][0]["file"]) == png()
    page = bundle.read("report.html").decode()
    assert "validated" in page and "<script" not in page and "http://" not in page and "https://" not in page
    assert f'src="screenshots/{shot["sha256"]}.png"' in page
    everything = b"".join(bundle.read(name) for name in bundle.namelist())
    assert node["credential"].encode() not in everything and not SECRET_PATTERN.search(everything.decode("latin-1"))
    assert client.get(f"/api/v1/admin/nodes/{node_id}/acceptance/export").status_code == 401


# --------------------------------------------------------------------------- the agent's side


def test_the_agent_runs_nvidia_smi_again_only_when_nvml_sees_other_gpus(tmp_path, monkeypatch):
    import modelforge_node_agent as agent

    runs = []
    monkeypatch.setattr(agent, "run_nvidia_smi", lambda: runs.append(1) or {"output": "", "exit_status": 0})
    gpu = agent.GpuFacts(0, GPU_A, "NVIDIA GeForce RTX 4080", 17_171_480_576, "550.54.14", "12.4", "0:1")
    smi = agent.NvidiaSmi()
    smi.facts([gpu]), smi.facts([gpu]), smi.facts([gpu])
    assert len(runs) == 1
    smi.facts([agent.GpuFacts(0, GPU_B, "NVIDIA GeForce RTX 4080", 17_171_480_576, "550.54.14", "12.4", "0:1")])
    assert len(runs) == 2
    assert set(agent.PROCESS_START) == {"start_id", "started_at"} and len(agent.PROCESS_START["start_id"]) == 32


def test_the_operator_guide_gives_the_same_inspect_command_and_query_as_the_code():
    from tests.support import PROJECT_ROOT

    guide = (PROJECT_ROOT / "docs" / "operator-guide.md").read_text(encoding="utf-8")
    assert acceptance.inspect_command(str(uuid.uuid4())) in guide
    assert acceptance.checklist.gpu_facts.NVIDIA_SMI_QUERY in guide


def test_the_operator_guide_says_enrolment_only_requests_production_eligibility():
    """§2 must not tell the operator to set the flag at enrolment: a node starts ineligible, §8 sets it."""
    from tests.support import PROJECT_ROOT

    guide = (PROJECT_ROOT / "docs" / "operator-guide.md").read_text(encoding="utf-8")
    enrol = guide[guide.index("## 2. Enrol a node") : guide.index("## 3. ")]
    assert "until the node has passed the acceptance checklist" not in enrol
    assert "(#8-acceptance-checklist-rtx-nodes)" in enrol
    assert "/production-eligibility" in enrol and "starts ineligible" in enrol
