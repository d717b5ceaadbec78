"""Bodies the API must refuse, one table each, shared by the API tests and the OpenAPI document's tests."""

from __future__ import annotations

import json

import pytest

from tests.support import ACQUIRE, BENCHMARK, GENERATE, factories
from tests.support.runtime import GOOD_BENCHMARK, GOOD_GENERATE, rate

WRONG_JOB_BODIES = [
    (BENCHMARK, {"model_file": "../outside.gguf"}, "params.model_file"),
    (BENCHMARK, {"model_file": "/data/artifacts/tiny.gguf"}, "params.model_file"),
    (BENCHMARK, {"model_file": "dir\\tiny.gguf"}, "params.model_file"),
    (BENCHMARK, {"model_file": "dir/./tiny.gguf"}, "params.model_file"),
    (BENCHMARK, {"model_file": ""}, "params.model_file"),
    (BENCHMARK, {**GOOD_BENCHMARK, "n_gpu_layers": -2}, "params.n_gpu_layers"),
    (BENCHMARK, {**GOOD_BENCHMARK, "prompt_tokens": 8193}, "params.prompt_tokens"),
    (BENCHMARK, {**GOOD_BENCHMARK, "generate_tokens": 0}, "params.generate_tokens"),
    (BENCHMARK, {**GOOD_BENCHMARK, "repetitions": 51}, "params.repetitions"),
    (BENCHMARK, {**GOOD_BENCHMARK, "repetitions": "5"}, "params.repetitions"),
    (BENCHMARK, {**GOOD_BENCHMARK, "prompts": ["Hi"]}, "params.prompts"),
    (GENERATE, {**GOOD_GENERATE, "prompts": []}, "params.prompts"),
    (GENERATE, {**GOOD_GENERATE, "prompts": ["Hi"] * 17}, "params.prompts"),
    (GENERATE, {**GOOD_GENERATE, "prompts": ["two\nlines"]}, "params.prompts[0]"),
    (GENERATE, {**GOOD_GENERATE, "prompts": ["ok", "x" * 8001]}, "params.prompts[1]"),
    (GENERATE, {**GOOD_GENERATE, "max_tokens": 4097}, "params.max_tokens"),
    (GENERATE, {"model_file": "tiny.gguf"}, "params.prompts"),
    (ACQUIRE, GOOD_BENCHMARK, "params.repo_id"),
    ("runtime.unknown.v1", GOOD_BENCHMARK, "type"),
    (None, GOOD_BENCHMARK, "type"),
]


WRONG_BENCHMARK_RESULTS = [
    ("acquire-shaped", "result.artifact_id"),
    ("generate-shaped", "result.n_gpu_layers"),
    ({"load_seconds": float("inf")}, "result.load_seconds"),
    ({"load_seconds": -1}, "result.load_seconds"),
    ({"prompt_tokens_per_second": rate(1.0, 51)}, "result.prompt_tokens_per_second.samples"),
    (
        {"prompt_tokens_per_second": {"mean": 1.0, "stddev": 0.0, "samples": []}},
        "result.prompt_tokens_per_second.samples",
    ),
    (
        {"generate_tokens_per_second": {"mean": "fast", "stddev": 0, "samples": [1]}},
        "result.generate_tokens_per_second.mean",
    ),
    ({"model_file": "../../etc/passwd"}, "result.model_file"),
    ({"gpu_uuids": "GPU-1"}, "result.gpu_uuids"),
    ({"peak_rss_bytes": -5}, "result.peak_rss_bytes"),
    ({"engine": None}, "result.engine"),
]


WRONG_HEARTBEATS = [
    ({"health": None}, "health"),
    ({"health": "ok"}, "health"),
    ({"health": {"status": "fine"}}, "health.status"),
    ({"health": {"status": "ok", "detail": 5}}, "health.detail"),
    ({"agent_version": 1}, "agent_version"),
    ({"agent_version": "v" * 65}, "agent_version"),
    ({"telemetry": {}}, "telemetry"),
    ({"telemetry": [1]}, "telemetry[0]"),
    ({"telemetry": [factories.sample() for _ in range(65)]}, "telemetry"),
    ({"telemetry": [factories.sample(sampled_at="yesterday")]}, "telemetry[0].sampled_at"),
    ({"telemetry": [factories.sample(sampled_at="2026-01-01T00:00:00")]}, "telemetry[0].sampled_at"),
    ({"telemetry": [factories.sample(utilization_gpu_percent=101)]}, "telemetry[0].utilization_gpu_percent"),
    ({"telemetry": [factories.sample(utilization_gpu_percent="50")]}, "telemetry[0].utilization_gpu_percent"),
    ({"telemetry": [factories.sample(power_w=True)]}, "telemetry[0].power_w"),
    ({"telemetry": [factories.sample(memory_used_bytes=-1)]}, "telemetry[0].memory_used_bytes"),
    ({"telemetry": [factories.sample(memory_used_bytes=1.5)]}, "telemetry[0].memory_used_bytes"),
    ({"telemetry": [factories.sample(gpu_uuid="")]}, "telemetry[0].gpu_uuid"),
    ({"telemetry": [factories.sample(gpu_uuid=["GPU-1"])]}, "telemetry[0].gpu_uuid"),
    ({"telemetry": [factories.sample(power_w=10**400)]}, "telemetry[0].power_w"),
    ({"telemetry": [factories.sample(sampled_at="0001-01-01T00:00:00+01:00")]}, "telemetry[0].sampled_at"),
    ({"telemetry": [factories.sample(sampled_at="9999-12-31T23:59:59-01:00")]}, "telemetry[0].sampled_at"),
    ({"telemetry": [factories.sample(sampled_at="1999-12-31T23:59:59Z")]}, "telemetry[0].sampled_at"),
    ({"health": {"status": "ok", "detail": "\ud800"}}, "health.detail"),
    # Issue 15: bidi controls in agent text would reorder the server's timestamps on the node page.
    ({"health": {"status": "ok", "detail": "ok \u202e 12:00"}}, "health.detail"),
    ({"health": {"status": "ok", "detail": "arabic letter mark \u061c"}}, "health.detail"),
]


WRONG_INVENTORIES = [
    ({"inventory": None}, "inventory"),
    ({"inventory": []}, "inventory"),
    ({"inventory": {"gpus": "none"}}, "inventory.gpus"),
    ({"inventory": {"gpus": [{"name": "no uuid"}]}}, "inventory.gpus[0].uuid"),
    (
        {"inventory": {"gpus": [factories.gpu(memory_total_bytes="16GB")]}},
        "inventory.gpus[0].memory_total_bytes",
    ),
    ({"inventory": {"gpus": [factories.gpu(), factories.gpu()]}}, "inventory.gpus"),
    ({"inventory": {"hostname": 7, "gpus": []}}, "inventory.hostname"),
    # Issue 15: every fact is declared and bounded (N4, P5); these once reached the node page.
    ({"inventory": {"gpus": [], "os": "bad \ud800"}}, "inventory.os"),
    ({"inventory": {"gpus": [], "os": "Debian \u202e 12"}}, "inventory.os"),
    ({"inventory": {"gpus": [], "kernel": "k" * 201}}, "inventory.kernel"),
    ({"inventory": {"gpus": [], "cpu_model": ["AMD"]}}, "inventory.cpu_model"),
    ({"inventory": {"gpus": [], "cpu_count": "many"}}, "inventory.cpu_count"),
    ({"inventory": {"gpus": [], "cpu_count": -1}}, "inventory.cpu_count"),
    ({"inventory": {"gpus": [], "memory_total_bytes": 10**400}}, "inventory.memory_total_bytes"),
    ({"inventory": {"gpus": [], "memory_total_bytes": 2**63}}, "inventory.memory_total_bytes"),
    ({"inventory": {"gpus": [], "memory_limited_by_cgroup": "yes"}}, "inventory.memory_limited_by_cgroup"),
    ({"inventory": {"gpus": [], "storage": ["state"]}}, "inventory.storage"),
    (
        {"inventory": {"gpus": [], "storage": {"state": {"total_bytes": -1}}}},
        "inventory.storage.state.total_bytes",
    ),
    ({"inventory": {"gpus": [], "storage": {"state": {"path": "/a\nb"}}}}, "inventory.storage.state.path"),
    ({"inventory": {"gpus": [], "unknown_reasons": ["a"]}}, "inventory.unknown_reasons"),
    ({"inventory": {"gpus": [], "unknown_reasons": {"os": 5}}}, "inventory.unknown_reasons.os"),
    ({"inventory": {"gpus": [], "gpu_unknown_reasons": {"GPU-1": "lost"}}}, "inventory.gpu_unknown_reasons.GPU-1"),
    ({"inventory": {"gpus": [], "accelerator_mode": "\u2066nvidia"}}, "inventory.accelerator_mode"),
    ({"inventory": {"gpus": [], "agent": {"version": 1}}}, "inventory.agent.version"),
    ({"inventory": {"gpus": [factories.gpu(driver_version="d" * 65)]}}, "inventory.gpus[0].driver_version"),
    ({"inventory": {"gpus": [factories.gpu(name="RTX \u202e")]}}, "inventory.gpus[0].name"),
    # W1: the runtime worker the agent relays.
    ({"runtime_worker": {"protocol_version": 1}}, "runtime_worker.worker_version"),
    ({"runtime_worker": {"worker_version": "1", "protocol_version": True}}, "runtime_worker.protocol_version"),
    ({"runtime_worker": {"worker_version": "1", "protocol_version": [1]}}, "runtime_worker.protocol_version"),
    ({"runtime_worker": "up"}, "runtime_worker"),
    ({"runtime_worker_problem": "two\nlines"}, "runtime_worker_problem"),
]


WRONG_ENROLLS = [
    ({"node_id": "not-a-uuid"}, "node_id"),
    ({"node_id": 12}, "node_id"),
    ({"hostname": ""}, "hostname"),
    ({"hostname": "h" * 256}, "hostname"),
    ({"control_plane_url": "modelforge.lan"}, "control_plane_url"),
    ({"enrollment_token": None}, "enrollment_token"),
    ({"enrollment_token": {"token": "x"}}, "enrollment_token"),
    ({"hostname": "gpu-\udc80"}, "hostname"),
]


RAW_INVENTORIES = [
    pytest.param(b'"memory_total_bytes": 1e400', "inventory.memory_total_bytes", id="1e400-bytes"),
    pytest.param(b'"cpu_count": 1e400', "inventory.cpu_count", id="1e400-cpus"),
    pytest.param(b'"cpu_count": -1e400', "inventory.cpu_count", id="minus-1e400"),
    pytest.param(b'"memory_total_bytes": 1' + b"0" * 400, "inventory.memory_total_bytes", id="400-digits"),
    pytest.param(b'"os": "\\ud800"', "inventory.os", id="lone-surrogate"),
]

HOSTILE_HOSTS = ["a b", "[::1", "", "exa mple.com:8000", "host:99999", "host:port", "a/b", "user@host", "é.example"]


def new_uuid(batch: int, index: int) -> str:
    return f"GPU-{batch:08d}-0000-0000-0000-{index:012d}"


def strict_json(text: str) -> object:
    """JSON as a strict parser reads it: NaN and Infinity are not JSON (RFC 8259)."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


# S1: client API keys to mint that the API refuses, and the field each 400 names.
WRONG_API_KEYS = [
    ({}, "name"),
    ({"name": ""}, "name"),
    ({"name": "   "}, "name"),
    ({"name": "x" * 201}, "name"),
    ({"name": "two\nlines"}, "name"),
    ({"name": "a\x00b"}, "name"),
    ({"name": "\u202eevil"}, "name"),
    ({"name": 5}, "name"),
    ({"name": "laptop", "expires_in_seconds": 59}, "expires_in_seconds"),
    ({"name": "laptop", "expires_in_seconds": 5 * 365 * 86_400 + 1}, "expires_in_seconds"),
    ({"name": "laptop", "expires_in_seconds": "3600"}, "expires_in_seconds"),
    ({"name": "laptop", "expires_in_seconds": True}, "expires_in_seconds"),
    ({"name": "laptop", "expires_in_seconds": 3600.5}, "expires_in_seconds"),
    ({"name": "laptop", "expires_in_seconds": -1}, "expires_in_seconds"),
    ({"name": "laptop", "key": "mfk_" + "a" * 43}, "key"),
]
