"""S3: a deployment without `node_id` is placed by the documented rules, and when no node can take
it `409 NO_NODE_FITS` names every node with its reason. Nodes of every kind side by side (CPU and
CUDA workers, little and much memory, flags off, draining, offline, no worker, no artifact), on
SQLite and PostgreSQL; the 70B-class header is a real one, written with gguf's writer (tensor infos
only, the data left as a hole) and read as the agent reads it.
"""

from __future__ import annotations

import os
import re

import gguf
import numpy as np
import pytest
import sqlalchemy as sa

from app.extensions import db
from app.models import Deployment
from modelforge_agent_gguf import describe_file
from tests.support import ACQUIRE, ADMIN, factories
from tests.support.nodes import agent, beat, online_node, publish_inventory, silence
from tests.support.runtime import COMMIT, ROOT_PATH, acquired_artifact, create, serving_node, tiny_facts, worker

DEPLOYMENTS = "/api/v1/admin/deployments"
GIB = 2**30
GPU_UUID = "GPU-00000000-0000-0000-0000-000000000001"


def cuda_worker() -> dict:
    return {
        **worker(),
        "engines": [{"name": "llama.cpp", "version": "0.3.36", "backend": "cuda"}],
        "devices": [{"uuid": GPU_UUID, "name": "NVIDIA GeForce RTX 4080", "memory_total_bytes": 16 * GIB}],
    }


def node_with(client, hostname: str, memory: int = 64 * GIB, **facts) -> dict:
    """A serving node whose inventory says it has `memory`."""
    node = serving_node(client, hostname, **facts)
    inventory = factories.inventory_body(memory_total_bytes=memory)["inventory"]
    publish_inventory(client, node, inventory=inventory, **{"runtime_worker": worker(), **facts})
    return node


def deploy(client, artifact: dict, **body):
    return client.post(
        DEPLOYMENTS,
        json={"name": "chat", "artifact_id": artifact["id"], "model_file": "tiny.gguf", **body},
        headers=ADMIN,
    )


def acquire_reporting(client, node: dict, repo_id: str, commit: str, **result) -> object:
    """A real acquire job on the node, completed with this result (`models` as its agent would
    report the headers); the complete reply."""
    root = client.post(
        f"/api/v1/admin/nodes/{node['id']}/storage-roots",
        headers=ADMIN,
        json={
            "name": repo_id.replace("/", "-"),
            "host_path": "/mnt/m",
            "container_path": ROOT_PATH,
            "min_free_bytes": 0,
        },
    )
    job = create(client, ACQUIRE, node["id"], {"repo_id": repo_id, "storage_root_id": root.get_json()["id"]})
    assert agent(client, node, "jobs/claim", capabilities=[ACQUIRE]).get_json()["job"]["id"] == job.get_json()["id"]
    body = {"commit": commit, "container_path": f"{ROOT_PATH}/models/{repo_id}/{commit}", "files": 1, "total_bytes": 10}
    return agent(client, node, f"jobs/{job.get_json()['id']}/complete", attempt=1, result={**body, **result})


def reasons(refused, nodes: dict[str, dict]) -> dict[str, str]:
    """Each node's reason, by the name the test gave it."""
    names = {node["id"]: name for name, node in nodes.items()}
    return {names[verdict["node_id"]]: verdict["reason"] for verdict in refused.get_json()["nodes"]}


@pytest.fixture
def fleet(app, client):
    """Eight nodes, each with one thing that decides for or against it."""
    nodes = {
        "roomy": node_with(client, "roomy", 64 * GIB),
        "small": node_with(client, "small", 8 * GIB),
        "gpu-full": node_with(client, "gpu-full", 64 * GIB, runtime_worker=cuda_worker()),
        "not-lab": None,
        "draining": node_with(client, "draining"),
        "offline": node_with(client, "offline"),
        "no-worker": online_node(client, "no-worker"),
        "no-model": node_with(client, "no-model"),
    }
    enrolled = factories.enrolled_node(client, {"lab_eligible": False}, hostname="not-lab")
    nodes["not-lab"] = {**enrolled, "id": enrolled["node_id"], "auth": factories.bearer(enrolled["credential"])}
    client.post(
        "/api/v1/agent/inventory",
        json={**factories.inventory_body(), "runtime_worker": worker()},
        headers=nodes["not-lab"]["auth"],
    )
    beat(client, nodes["not-lab"])
    beat(client, nodes["gpu-full"], telemetry=[factories.sample(memory_used_bytes=16 * GIB - 64 * 2**20)])
    artifacts = {name: acquired_artifact(client, node) for name, node in nodes.items() if name != "no-model"}
    assert client.post(f"/api/v1/admin/nodes/{nodes['draining']['id']}/drain", headers=ADMIN).status_code == 200
    silence(app, nodes["offline"]["id"])
    return nodes, artifacts


def test_the_node_with_the_most_memory_left_is_chosen_and_every_other_node_says_why_not(client, fleet):
    nodes, artifacts = fleet
    created = deploy(client, artifacts["small"])  # any node's copy names the model
    assert created.status_code == 201, created.get_json()
    deployment = created.get_json()
    assert deployment["node_id"] == nodes["roomy"]["id"]
    assert deployment["artifact_id"] == artifacts["roomy"]["id"]  # the chosen node's own copy
    assert deployment["placement"]["why"].startswith("placed; fits: needs 56.9 MiB of 64.0 GiB free")

    other = deploy(client, artifacts["small"], name="chat-2", context_length=8192)
    assert other.status_code == 201
    assert other.get_json()["node_id"] == nodes["roomy"]["id"]  # still the most left, less what chat holds


def test_no_node_fits_lists_every_node_and_its_reason(app, client, fleet):
    nodes, artifacts = fleet
    with app.app_context():
        rows_before = db.session.scalar(sa.select(sa.func.count()).select_from(Deployment))
    for name in ("roomy", "small"):
        assert client.post(f"/api/v1/admin/nodes/{nodes[name]['id']}/disable", headers=ADMIN).status_code == 200
    refused = deploy(client, artifacts["roomy"])
    assert refused.status_code == 409
    assert refused.get_json()["error"]["code"] == "NO_NODE_FITS"
    found = reasons(refused, nodes)
    assert found == {
        "roomy": "node is disabled",
        "small": "node is disabled",
        "gpu-full": found["gpu-full"],
        "not-lab": "not eligible for the lab tier (lab_eligible is false)",
        "draining": "node is draining",
        "offline": "node is offline",
        "no-worker": "no compatible runtime worker answers on the node",
        "no-model": f"does not hold owner/tiny-gguf at {COMMIT[:12]}",
    }
    assert re.fullmatch(r"needs [\d.]+ MiB on GPU 0, which has 56.0 MiB free", found["gpu-full"]), found
    for verdict in refused.get_json()["nodes"]:
        assert f"{verdict['name']}: {verdict['reason']}" in refused.get_json()["error"]["message"]
    with app.app_context():
        assert db.session.scalar(sa.select(sa.func.count()).select_from(Deployment)) == rows_before


def test_a_node_already_serving_the_model_is_preferred(app, client, fleet):
    nodes, artifacts = fleet
    first = deploy(client, artifacts["small"], node_id=nodes["small"]["id"]).get_json()
    assert first["node_id"] == nodes["small"]["id"]
    assert (
        agent(
            client,
            nodes["small"],
            f"deployments/{first['id']}/status",
            state="ready",
            measured={"load_seconds": 0.1, "memory_bytes": 60 * 2**20, "context_length": 2048},
        ).status_code
        == 200
    )
    second = deploy(client, artifacts["roomy"], name="chat-again").get_json()
    assert second["node_id"] == nodes["small"]["id"]
    assert second["placement"]["why"].endswith("already serves this model")


def test_the_estimate_learns_from_what_the_node_measured(client, fleet):
    nodes, artifacts = fleet
    small = nodes["small"]
    first = deploy(client, artifacts["small"], node_id=small["id"]).get_json()
    planned = first["placement"]["estimate"]
    assert planned["corrected_by"] == 0 and planned["correction"] == 1.0
    measured = int(first["placement"]["raw_resident_bytes"] * 1.3)  # this node runs 30% heavier
    agent(
        client,
        small,
        f"deployments/{first['id']}/status",
        state="ready",
        measured={"load_seconds": 0.1, "memory_bytes": measured, "context_length": 2048},
    )
    second = deploy(client, artifacts["small"], name="chat-2", node_id=small["id"]).get_json()
    learned = second["placement"]["estimate"]
    assert learned["corrected_by"] == 1 and learned["correction"] == pytest.approx(1.3, abs=0.001)
    assert learned["resident_bytes"] == pytest.approx(measured, rel=0.001)


def write_70b_header(path) -> None:
    """A llama-3-70B-shaped header in Q8_0 (75 GB): tensor infos only, the data left out."""
    writer = gguf.GGUFWriter(path, "llama")
    n_embd, n_ff, n_layer, n_vocab, n_kv = 8192, 28672, 80, 128256, 8
    writer.add_context_length(8192)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(64)
    writer.add_head_count_kv(n_kv)
    q8 = gguf.GGMLQuantizationType.Q8_0

    def info(name: str, shape: tuple[int, ...], kind=q8) -> None:
        block, size = gguf.GGML_QUANT_SIZES[kind]
        nbytes = int(np.prod(shape)) * size // block
        writer.add_tensor_info(name, list(reversed(shape)), np.dtype(np.float32), nbytes, raw_dtype=kind)

    info("token_embd.weight", (n_vocab, n_embd))
    for layer in range(n_layer):
        info(f"blk.{layer}.attn_norm.weight", (n_embd,), gguf.GGMLQuantizationType.F32)
        for name, rows in (("attn_q", n_embd), ("attn_k", 1024), ("attn_v", 1024), ("attn_output", n_embd)):
            info(f"blk.{layer}.{name}.weight", (rows, n_embd))
        for name, shape in (("ffn_gate", (n_ff, n_embd)), ("ffn_up", (n_ff, n_embd)), ("ffn_down", (n_embd, n_ff))):
            info(f"blk.{layer}.{name}.weight", shape)
    info("output.weight", (n_vocab, n_embd))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return None


def test_a_70b_class_header_is_placed_nowhere_with_the_memory_it_needs(tmp_path, client, fleet):
    nodes, _ = fleet
    path = tmp_path / "big.gguf"
    write_70b_header(path)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        cut_short = describe_file(fd, "big.gguf")  # tensor infos only: the data is not there
        assert "file is cut short" in cut_short["problem"]
        declared = int(cut_short["problem"].split("end at byte ")[1].split()[0])
        os.truncate(path, declared)  # a hole of the declared size: nothing is written
        facts = describe_file(fd, "big.gguf")
    finally:
        os.close(fd)
    assert facts["weights_bytes"] > 65 * GIB and facts["block_count"] == 80, facts
    node = nodes["roomy"]
    done = acquire_reporting(
        client, node, "owner/llama-70b", "c" * 40, total_bytes=facts["file_bytes"], models={"big.gguf": facts}
    )
    assert done.status_code == 200, done.get_json()
    artifact = done.get_json()["job"]["result"]
    refused = client.post(
        DEPLOYMENTS,
        headers=ADMIN,
        json={"name": "big", "artifact_id": artifact["artifact_id"], "model_file": "big.gguf"},
    )
    assert refused.status_code == 409
    (verdict,) = [each for each in refused.get_json()["nodes"] if each["node_id"] == node["id"]]
    assert verdict["reason"].startswith("needs 7") and verdict["reason"].endswith("has 64.0 GiB free"), verdict
    assert verdict["needs_bytes"] > facts["weights_bytes"]


@pytest.mark.parametrize(
    ("problem", "reason"),
    [
        ({"problem": "llama.block_count is 2147483647, not a count between 1 and 4096"}, "no estimate: its header"),
        (None, "no estimate: no header facts"),
    ],
)
def test_a_header_that_cannot_be_believed_is_refused_with_its_reason_not_a_5xx(client, problem, reason):
    node = node_with(client, "only")
    done = acquire_reporting(
        client, node, "owner/bad", COMMIT, **({"models": {"tiny.gguf": problem}} if problem else {})
    )
    assert done.status_code == 200, done.get_json()
    refused = deploy(client, {"id": done.get_json()["job"]["result"]["artifact_id"]})
    assert refused.status_code == 409
    assert reasons(refused, {"only": node})["only"].startswith(reason)


@pytest.mark.parametrize(
    "facts",
    [
        {"architecture": "llama"},  # no weights_bytes, no problem
        {"architecture": "Llama!", "weights_bytes": 1},
        {"architecture": "llama", "weights_bytes": -1},
        {"architecture": "llama", "weights_bytes": 1, "block_count": 0},
        {"problem": "two\nlines"},
    ],
)
def test_facts_a_node_cannot_have_read_are_a_400_and_nothing_is_stored(client, facts):
    node = node_with(client, "liar")
    refused = acquire_reporting(client, node, "owner/bad", COMMIT, models={"tiny.gguf": facts})
    assert refused.status_code == 400, refused.get_json()
    assert refused.get_json()["error"]["field"].startswith("result.models")
    assert client.get(f"/api/v1/admin/nodes/{node['id']}/artifacts", headers=ADMIN).get_json()["artifacts"] == []


def test_tiny_facts_are_what_the_header_says():
    facts = tiny_facts()
    assert (facts["architecture"], facts["block_count"], facts["embedding_length"]) == ("llama", 2, 64)
    assert facts["weights_by_type"] == {"F32": facts["weights_bytes"]}


def listed(client, node) -> list[str]:
    """The deployment ids the node's heartbeat reply hands its agent."""
    return [each["id"] for each in beat(client, node)["deployments"]]


def test_a_draining_nodes_deployment_moves_to_the_best_other_node_and_leaves_the_old_ones_list(app, client, fleet):
    nodes, artifacts = fleet
    small, roomy = nodes["small"], nodes["roomy"]
    deployment = deploy(client, artifacts["small"], node_id=small["id"], context_length=1024).get_json()
    agent(
        client,
        small,
        f"deployments/{deployment['id']}/status",
        state="ready",
        measured={"load_seconds": 0.1, "memory_bytes": 60 * 2**20, "context_length": 1024},
    )
    assert listed(client, small) == [deployment["id"]]
    assert client.post(f"/api/v1/admin/nodes/{small['id']}/drain", headers=ADMIN).status_code == 200
    moved = client.post(f"{DEPLOYMENTS}/{deployment['id']}/move", json={}, headers=ADMIN)
    assert moved.status_code == 200, moved.get_json()
    after = moved.get_json()
    assert (after["id"], after["name"], after["context_length"]) == (deployment["id"], "chat", 1024)
    assert (after["node_id"], after["artifact_id"], after["state"]) == (
        roomy["id"],
        artifacts["roomy"]["id"],
        "pending",
    )
    assert after["measured"] is None and after["placement"]["why"].startswith("placed; fits")
    assert listed(client, small) == [] and listed(client, roomy) == [deployment["id"]]
    # The old node's late report about it is refused as unknown: it is no longer its deployment.
    late = agent(client, small, f"deployments/{deployment['id']}/status", state="ready")
    assert late.status_code == 404
    events = client.get("/api/v1/admin/audit-events", headers=ADMIN).get_json()["audit_events"]
    (event,) = [each for each in events if each["action"] == "deployment.moved"]
    assert event["node_id"] == roomy["id"] and event["details"]["from_node_id"] == small["id"]


def test_a_move_names_a_node_or_is_refused_with_every_reason(client, fleet):
    nodes, artifacts = fleet
    roomy = nodes["roomy"]
    deployment = deploy(client, artifacts["roomy"], node_id=roomy["id"]).get_json()
    again = client.post(f"{DEPLOYMENTS}/{deployment['id']}/move", json={"node_id": roomy["id"]}, headers=ADMIN)
    assert again.status_code == 409 and again.get_json()["error"]["code"] == "DEPLOYMENT_NOT_MOVABLE"
    to_draining = client.post(
        f"{DEPLOYMENTS}/{deployment['id']}/move", json={"node_id": nodes["draining"]["id"]}, headers=ADMIN
    )
    assert to_draining.status_code == 409 and to_draining.get_json()["error"]["code"] == "NODE_DRAINING"
    assert client.post(f"/api/v1/admin/nodes/{nodes['small']['id']}/disable", headers=ADMIN).status_code == 200
    nowhere = client.post(f"{DEPLOYMENTS}/{deployment['id']}/move", json={}, headers=ADMIN)
    assert nowhere.status_code == 409 and nowhere.get_json()["error"]["code"] == "NO_NODE_FITS"
    assert roomy["id"] not in {verdict["node_id"] for verdict in nowhere.get_json()["nodes"]}  # not back home
    assert client.get(f"{DEPLOYMENTS}/{deployment['id']}", headers=ADMIN).get_json()["node_id"] == roomy["id"]
    assert client.delete(f"{DEPLOYMENTS}/{deployment['id']}", headers=ADMIN).status_code == 202
    stopping = client.post(f"{DEPLOYMENTS}/{deployment['id']}/move", json={}, headers=ADMIN)
    assert stopping.status_code == 409 and stopping.get_json()["error"]["code"] == "DEPLOYMENT_NOT_MOVABLE"
    bad = client.post(f"{DEPLOYMENTS}/{deployment['id']}/move", json={"node_id": "x"}, headers=ADMIN)
    assert bad.status_code == 400


def test_a_cuda_worker_with_room_on_its_gpu_is_placed_by_its_free_memory(client):
    """S3: on a CUDA worker the offloaded weights and KV cache go against the GPU's latest fresh
    reading; with every layer offloaded the whole of it is on the GPU, and CPU-only (n_gpu_layers
    0) is judged against host memory instead."""
    gpu_node = node_with(client, "gpu", 4 * GIB, runtime_worker=cuda_worker())
    beat(client, gpu_node, telemetry=[factories.sample(memory_used_bytes=2 * GIB)])
    artifact = acquired_artifact(client, gpu_node)
    on_gpu = deploy(client, artifact).get_json()
    estimate = on_gpu["placement"]["estimate"]
    assert on_gpu["node_id"] == gpu_node["id"] and estimate["on_gpu"] is True
    assert on_gpu["placement"]["free_bytes"] == 17_171_480_576 - 2 * GIB  # its total less what the reading uses
    (per_gpu,) = estimate["per_gpu_bytes"]
    assert per_gpu > estimate["parts"]["weights"] + estimate["parts"]["kv_cache"]  # plus CUDA's own and compute
    on_cpu = deploy(client, artifact, name="cpu-only", n_gpu_layers=0).get_json()
    assert on_cpu["placement"]["estimate"]["on_gpu"] is False
    assert on_cpu["placement"]["free_bytes"] < 4 * GIB  # host memory, less what the first one holds


def test_a_gpu_without_a_fresh_reading_is_not_guessed_at(app, client):
    gpu_node = node_with(client, "gpu", runtime_worker=cuda_worker())
    artifact = acquired_artifact(client, gpu_node)
    with app.app_context():
        db.session.execute(sa.text("UPDATE telemetry_samples SET sampled_at = 0"))
        db.session.commit()
    refused = deploy(client, artifact)
    assert refused.status_code == 409
    assert reasons(refused, {"gpu": gpu_node})["gpu"] == f"no fresh memory reading for GPU {GPU_UUID}"
