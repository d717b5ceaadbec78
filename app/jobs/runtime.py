"""W2: runtime jobs — what may be asked of the runtime worker, and the results it leaves per node and model.

Grouped by capability: the bounds of `runtime.benchmark.v1` and `runtime.generate.v1` params (the
API's body models and the console's forms both read them here), then each type's results as the
node's history shows them. Stored results are read defensively: a field of the wrong type or a
non-finite number comes back as None (P3), so an old or odd row never breaks a page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sqlalchemy as sa

from app.extensions import db
from app.models import Job, JobState
from app.nodes.compat import COMPATIBLE
from app.timeutil import isoformat

BENCHMARK = "runtime.benchmark.v1"
GENERATE = "runtime.generate.v1"
TYPES = (BENCHMARK, GENERATE)
PREFIX = "runtime."
RESULTS_LIMIT = 50


@dataclass(frozen=True)
class Bound:
    """A whole-number param: its range and the default the worker uses when it is left out."""

    minimum: int
    maximum: int
    default: int


# runtime.benchmark.v1, measured as llama-bench does (pp512/tg128 by default, worker/README.md).
N_GPU_LAYERS = Bound(-1, 1000, -1)  # -1: every layer on the GPU when the worker has one
PROMPT_TOKENS = Bound(1, 8192, 512)
GENERATE_TOKENS = Bound(1, 4096, 128)
REPETITIONS = Bound(1, 50, 5)
# runtime.generate.v1: the smoke test.
MAX_TOKENS = Bound(1, 4096, 64)
MAX_PROMPTS = 16
MAX_PROMPT_LENGTH = 8000
# Results: one sample per repetition, one output per prompt, each text at most 64 KiB.
MAX_SAMPLES = REPETITIONS.maximum
MAX_OUTPUT_LENGTH = 64 * 1024
# The most a complete request may carry: every output at its longest, escaped as JSON, with room.
MAX_COMPLETE_BYTES = 4 * 2**20


def is_runtime(job_type: str) -> bool:
    """Whether a job type is run by the runtime worker (and so needs a compatible one, W1)."""
    return job_type.startswith(PREFIX)


def runnable(capabilities: list[str], worker_answer: str | None) -> list[str]:
    """W1: the advertised types a node may get; runtime.* only while its worker is COMPATIBLE."""
    return [kind for kind in capabilities if worker_answer == COMPATIBLE or not is_runtime(kind)]


# --------------------------------------------------------------------------- reading stored values


def _number(value: object) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _rate(value: object) -> dict[str, object] | None:
    """A tokens/s figure: mean, sample standard deviation and the samples; None when unreadable."""
    if not isinstance(value, dict) or _number(value.get("mean")) is None:
        return None
    samples = value.get("samples")
    return {
        "mean": _number(value.get("mean")),
        "stddev": _number(value.get("stddev")),
        "samples": [_number(sample) for sample in samples] if isinstance(samples, list) else [],
    }


def _engine(value: object) -> dict[str, str | None] | None:
    if not isinstance(value, dict):
        return None
    return {key: _text(value.get(key)) for key in ("name", "version", "backend")}


def _succeeded(node_id: str, job_type: str, limit: int) -> list[Job]:
    return list(
        db.session.scalars(
            sa.select(Job)
            .where(Job.node_id == node_id, Job.type == job_type, Job.state == JobState.SUCCEEDED)
            .order_by(Job.finished_at.desc(), Job.id.desc())
            .limit(limit)
        )
    )


def _model(job: Job, result: dict) -> dict[str, object]:
    """Which model a result is of: the artifact (repo and commit kept in the result) and the file."""
    params = job.params if isinstance(job.params, dict) else {}
    return {
        "job_id": job.id,
        "artifact_id": _text(result.get("artifact_id")) or job.artifact_id,
        "repo_id": _text(result.get("repo_id")),
        "commit": _text(result.get("commit")),
        "model_file": _text(result.get("model_file")) or _text(params.get("model_file")),
        "finished_at": isoformat(job.finished_at),
    }


# --------------------------------------------------------------------------- runtime.benchmark.v1


def benchmark_row(job: Job) -> dict[str, object]:
    """One benchmark run as the node's history shows it."""
    result = job.result if isinstance(job.result, dict) else {}
    gpus = result.get("gpu_uuids")
    return {
        **_model(job, result),
        "n_gpu_layers": _whole(result.get("n_gpu_layers")),
        "prompt_tokens": _whole(result.get("prompt_tokens")),
        "generate_tokens": _whole(result.get("generate_tokens")),
        "repetitions": _whole(result.get("repetitions")),
        "prompt_tokens_per_second": _rate(result.get("prompt_tokens_per_second")),
        "generate_tokens_per_second": _rate(result.get("generate_tokens_per_second")),
        "time_to_first_token_seconds": _number(result.get("time_to_first_token_seconds")),
        "load_seconds": _number(result.get("load_seconds")),
        "peak_rss_bytes": _whole(result.get("peak_rss_bytes")),
        "peak_gpu_memory_bytes": _whole(result.get("peak_gpu_memory_bytes")),
        "gpu_uuids": [uuid for uuid in gpus if isinstance(uuid, str)] if isinstance(gpus, list) else [],
        "engine": _engine(result.get("engine")),
    }


# --------------------------------------------------------------------------- runtime.generate.v1


def _output(value: object) -> dict[str, object] | None:
    if not isinstance(value, dict):
        return None
    return {
        "prompt": _text(value.get("prompt")),
        "text": _text(value.get("text")),
        "prompt_tokens": _whole(value.get("prompt_tokens")),
        "completion_tokens": _whole(value.get("completion_tokens")),
        "finish_reason": _text(value.get("finish_reason")),
    }


def smoke_test(job: Job) -> dict[str, object]:
    """One generate run: the prompts and the text the model gave back (W2's smoke test)."""
    result = job.result if isinstance(job.result, dict) else {}
    outputs = result.get("outputs")
    readable = [_output(output) for output in outputs] if isinstance(outputs, list) else []
    return {
        **_model(job, result),
        "outputs": [output for output in readable if output is not None],
        "engine": _engine(result.get("engine")),
    }


# --------------------------------------------------------------------------- per node


def results(node_id: str, limit: int = RESULTS_LIMIT) -> dict[str, object]:
    """W2: a node's succeeded benchmarks (newest first, bounded) and its last smoke test."""
    last_generate = _succeeded(node_id, GENERATE, 1)
    return {
        "benchmarks": [benchmark_row(job) for job in _succeeded(node_id, BENCHMARK, limit)],
        "smoke_test": smoke_test(last_generate[0]) if last_generate else None,
    }
