"""Nodes for a benchmark without a node (S3): enrolled with the eligibility a test gives them, every
job type advertised and a compatible worker reported unless the test says otherwise."""

from __future__ import annotations

from tests.support import ADMIN, BENCHMARK, EVERY_TYPE, factories
from tests.support.nodes import WORKING_NODE, beat, publish_inventory
from tests.support.runtime import ENGINE, worker

JOBS = "/api/v1/admin/jobs"


def benchmark_node(
    client, hostname: str, eligibility: dict[str, bool] = WORKING_NODE, gpus: list[dict] | None = None, **facts
) -> dict:
    """An enrolled node with these flags that published an inventory under its hostname (with `gpus`,
    factories.inventory_body's one GPU by default; `facts` as publish_inventory takes them) and one
    heartbeat. Returns the enrol reply plus "id" and "auth"."""
    enrolled = factories.enrolled_node(client, eligibility, hostname=hostname)
    node = {**enrolled, "id": enrolled["node_id"], "auth": factories.bearer(enrolled["credential"])}
    inventory = factories.inventory_body(gpus, hostname=hostname)["inventory"]
    published = {"inventory": inventory, "capabilities": EVERY_TYPE, "runtime_worker": worker(), **facts}
    publish_inventory(client, node, **published)
    beat(client, node, telemetry=[])
    return node


def cuda_node(client, hostname: str, gpu_uuid: str, gpu_name: str, **facts) -> dict:
    """A benchmark node with one GPU in its inventory, which its CUDA worker runs on."""
    device = {"uuid": gpu_uuid, "name": gpu_name, "memory_total_bytes": 24 * 2**30}
    cuda = {**worker(), "engines": [{**ENGINE, "backend": "cuda"}], "devices": [device]}
    gpus = [factories.gpu(gpu_uuid, name=gpu_name)]
    node = benchmark_node(client, hostname, gpus=gpus, runtime_worker=cuda, **facts)
    beat(client, node, telemetry=[factories.sample(gpu_uuid, memory_used_bytes=2**30)])  # S3: a fresh reading to fit by
    return node


def cpu_node(client, hostname: str, **facts) -> dict:
    """A benchmark node without a GPU, its worker on the CPU."""
    return benchmark_node(client, hostname, gpus=[], **facts)


def fan_out(client, artifact: dict, **params):
    """POST a benchmark without a node, the model named by any node's copy of it."""
    body = {"type": BENCHMARK, "params": {"artifact_id": artifact["id"], "model_file": "tiny.gguf", **params}}
    return client.post(JOBS, json=body, headers=ADMIN)
