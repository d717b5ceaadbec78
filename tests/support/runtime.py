"""Runtime jobs through the Flask test client: a worker report, job bodies and results, and an
artifact left by a real acquire job."""

from __future__ import annotations

import functools
import os
import tempfile

from modelforge_agent_gguf import describe_file
from tests.support import ACQUIRE, ADMIN
from tests.support.nodes import agent, online_node
from tests.support.tiny_gguf import write_tiny_llama

COMMIT = "b" * 40


ROOT_PATH = "/data/artifacts/model-registry"


ARTIFACT_PATH = f"{ROOT_PATH}/models/owner/tiny-gguf/{COMMIT}"


ENGINE = {"name": "llama.cpp", "version": "0.3.36", "backend": "cpu"}


GOOD_BENCHMARK = {"model_file": "tiny.gguf"}

GOOD_GENERATE = {"model_file": "tiny.gguf", "prompts": ["Hello"]}


def worker(protocol_version: object = 1, worker_version: str = "0.1.0") -> dict[str, object]:
    """What the agent relays of the worker's GET /v1/info."""
    return {
        "worker_version": worker_version,
        "protocol_version": protocol_version,
        "engines": [ENGINE],
        "devices": [],
    }


@functools.cache
def tiny_facts() -> dict[str, object]:
    """What the agent reads from tiny.gguf's header (S3): a real tiny model's, written once."""
    with tempfile.TemporaryDirectory() as directory:
        write_tiny_llama(os.path.join(directory, "tiny.gguf"))
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return describe_file(fd, "tiny.gguf")
        finally:
            os.close(fd)


def serving_node(client, hostname: str | None = None, **facts: object) -> dict:
    """An online node (tests.support.nodes.online_node) whose agent relays a compatible worker (CPU
    unless `runtime_worker` says otherwise)."""
    return online_node(client, hostname, **{"runtime_worker": worker(), **facts})


def acquired_artifact(client, node) -> dict:
    """An artifact on the node, left by a real acquire job (J3), with tiny.gguf's header facts (S3)."""
    body = {"name": "models", "host_path": "/mnt/models", "container_path": ROOT_PATH, "min_free_bytes": 0}
    root = client.post(f"/api/v1/admin/nodes/{node['id']}/storage-roots", json=body, headers=ADMIN).get_json()
    job = create(client, ACQUIRE, node["id"], {"repo_id": "owner/tiny-gguf", "storage_root_id": root["id"]}).get_json()
    assert agent(client, node, "jobs/claim", capabilities=[ACQUIRE]).get_json()["job"]["id"] == job["id"]
    result = {
        "commit": COMMIT,
        "container_path": ARTIFACT_PATH,
        "files": 2,
        "total_bytes": 402112,
        "models": {"tiny.gguf": tiny_facts()},
    }
    assert agent(client, node, f"jobs/{job['id']}/complete", attempt=1, result=result).status_code == 200
    return client.get(f"/api/v1/admin/nodes/{node['id']}/artifacts", headers=ADMIN).get_json()["artifacts"][0]


def create(client, job_type, node_id, params, **extra):
    body = {"type": job_type, "node_id": node_id, "params": params, **extra}
    return client.post("/api/v1/admin/jobs", json=body, headers=ADMIN)


def benchmark_result(artifact_id: str, **overrides) -> dict:
    """A benchmark result as worker/README.md shows it, with the agent's artifact_id and model_file."""
    return {
        "artifact_id": artifact_id,
        "engine": ENGINE,
        "model_file": "tiny.gguf",
        "model_bytes": 402112,
        "n_gpu_layers": 0,
        "gpu_uuids": [],
        "load_seconds": 0.012,
        "prompt_tokens": 512,
        "generate_tokens": 128,
        "repetitions": 5,
        "prompt_tokens_per_second": rate(8123.4),
        "generate_tokens_per_second": rate(912.7),
        "time_to_first_token_seconds": 0.071,
        "peak_rss_bytes": 123456789,
        "peak_gpu_memory_bytes": None,
        **overrides,
    }


def generate_result(artifact_id: str, **overrides) -> dict:
    return {
        "artifact_id": artifact_id,
        "engine": ENGINE,
        "model_file": "tiny.gguf",
        "seed": 42,
        "temperature": 0.0,
        "max_tokens": 16,
        "gpu_uuids": [],
        "load_seconds": 0.01,
        "outputs": [
            {
                "prompt": "Hello",
                "text": " world.\nIt answers 👩‍💻",
                "prompt_tokens": 3,
                "completion_tokens": 16,
                "finish_reason": "length",
            }
        ],
        **overrides,
    }


def rate(mean: float, samples: int = 5) -> dict:
    return {"mean": mean, "stddev": mean / 100, "samples": [mean] * samples}
