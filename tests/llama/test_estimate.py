"""S3: the memory estimate from a GGUF header against what the real worker measures once the model
is loaded on the CPU: within ±15% for models of several sizes, context lengths, F16 and a quantized
type (Q8_0). The header is read as the agent reads it (agent/modelforge_agent_gguf.py) and the
estimate made as the control plane makes it (app/serving/estimate.py); the measurement is the
engine process's RSS that the worker reports in the deployment's `measured.memory_bytes`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.serving import estimate
from modelforge_agent_gguf import describe_file
from tests.support.tiny_gguf import write_tiny_llama
from tests.support.worker import deploy, serving_worker

TOLERANCE = 0.15
MIB = 2**20
# name: (writer arguments, the context lengths each is loaded at)
MODELS = {
    "tiny-f32.gguf": ({}, (512, 8192)),
    "small-f16.gguf": (
        {
            "n_layer": 4,
            "n_embd": 512,
            "n_ff": 1408,
            "n_head": 8,
            "n_head_kv": 4,
            "extra_vocab": 4000,
            "weight_type": "F16",
        },
        (2048,),
    ),
    "medium-f16.gguf": (
        {
            "n_layer": 6,
            "n_embd": 768,
            "n_ff": 2048,
            "n_head": 12,
            "n_head_kv": 4,
            "extra_vocab": 6000,
            "weight_type": "F16",
        },
        (512, 8192),
    ),
    "medium-q8_0.gguf": (
        {
            "n_layer": 6,
            "n_embd": 768,
            "n_ff": 2048,
            "n_head": 12,
            "n_head_kv": 4,
            "extra_vocab": 6000,
            "weight_type": "Q8_0",
        },
        (4096,),
    ),
}
PAIRS = [(name, context) for name, (_, contexts) in MODELS.items() for context in contexts]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("estimate-models")
    for name, (shape, _) in MODELS.items():
        write_tiny_llama(root / name, seed=3, **shape)
    return root


@pytest.fixture(scope="module")
def worker(models, tmp_path_factory):
    with serving_worker(models, tmp_path_factory.mktemp("worker") / "worker.log") as process:
        yield process


def header_facts(models: Path, name: str) -> dict:
    fd = os.open(models, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return describe_file(fd, name)
    finally:
        os.close(fd)


@pytest.mark.parametrize(("name", "context"), PAIRS)
def test_the_estimate_is_within_15_percent_of_the_memory_the_worker_measures(worker, models, name, context):
    facts = header_facts(models, name)
    assert "problem" not in facts, facts
    expected = estimate.estimate(facts, context)
    status = deploy(worker, name, context_length=context, idle_unload_seconds=0)
    try:
        assert status["state"] == "ready", status
        measured = status["measured"]["memory_bytes"]
    finally:
        worker.call("DELETE", f"/v1/deployments/{status['id']}")
    error = expected.resident_bytes / measured - 1
    print(
        f"\n{name} ctx {context}: estimated {expected.resident_bytes / MIB:.1f} MiB "
        f"(peak {expected.peak_bytes / MIB:.1f}), measured {measured / MIB:.1f} MiB, {error:+.1%}"
    )
    assert abs(error) <= TOLERANCE, (expected.to_dict(), measured)
    assert expected.peak_bytes > expected.resident_bytes  # the compute buffer, touched by a long prompt
