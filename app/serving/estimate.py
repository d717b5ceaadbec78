"""S3: how much memory a deployment will take, from its GGUF header's facts, before it is loaded.

The model is never loaded to find out: the agent read the header when it acquired the artifact
(agent/modelforge_agent_gguf.py) and the control plane keeps its facts with the artifact. The
figure is built the way the runtime worker loads a model (worker/modelforge_runtime_worker.py,
`serve_engine`): llama.cpp maps the weights, keeps one KV cache of `context_length` cells in F16
shared by the slots, and a small wrapper context beside it; the compute buffer is what one
micro-batch at full context needs with flash attention. Two figures come of it:

- `resident_bytes`: what the engine holds once loaded (the worker measures the same, RSS on a CPU
  worker), so the two can be compared;
- `peak_bytes`: resident plus the compute buffer, touched in full by a long prompt at full
  context. Placement fits this one.

Then the node's own history corrects it: the median of measured / estimated over its last
deployments that loaded (`correction`), so a node whose engine runs heavier or lighter than the
constants below is estimated from what it did.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

MIB = 1 << 20
# The worker's load (worker/modelforge_runtime_worker.py): its slots' context, the wrapper's own,
# and the micro-batch every llama_decode call is cut to.
WRAPPER_CONTEXT_TOKENS = 256
UBATCH_TOKENS = 512
CONTEXT_PAD = 256  # llama.cpp rounds a context up to this many cells
KV_BYTES_PER_VALUE = 2  # F16 cache, llama.cpp's default
DEFAULT_CONTEXT, MAX_CONTEXT = 8192, 8192  # S2: the model's own, capped (app/serving/deployments.py)
# The engine process without a model: Python, llama.cpp and its thread pools (measured on a CPU
# worker: 52 MiB, docs/benchmarks.md), and per GPU the CUDA context and cuBLAS workspace.
ENGINE_BYTES = 52 * MIB
GPU_RUNTIME_BYTES = 384 * MIB
CORRECTION_HISTORY = 8  # past deployments on the node that correct the next estimate
CORRECTION_RANGE = (0.5, 2.0)  # a wild measurement moves an estimate this far at most


@dataclass(frozen=True)
class Estimate:
    """One deployment's memory, before and after the node's history corrects it."""

    resident_bytes: int
    peak_bytes: int
    parts: dict[str, int]
    context_length: int
    on_gpu: bool
    per_gpu_bytes: list[int]
    correction: float = 1.0
    corrected_by: int = 0  # how many past deployments the correction comes from

    def to_dict(self) -> dict[str, object]:
        return {
            "resident_bytes": self.resident_bytes,
            "peak_bytes": self.peak_bytes,
            "parts": self.parts,
            "context_length": self.context_length,
            "on_gpu": self.on_gpu,
            "per_gpu_bytes": self.per_gpu_bytes,
            "correction": round(self.correction, 4),
            "corrected_by": self.corrected_by,
        }


class NotEstimable(ValueError):
    """The facts do not say enough (or said the header cannot be believed); the message says why."""


def context_for(facts: dict[str, object], asked: int | None) -> int:
    """The context the worker will load with: as asked, else the model's own, capped (S2)."""
    if asked is not None:
        return asked
    trained = facts.get("context_length")
    return min(int(trained) if isinstance(trained, int) and trained > 0 else DEFAULT_CONTEXT, MAX_CONTEXT)


def _count(facts: dict[str, object], key: str) -> int:
    value = facts.get(key)
    if not isinstance(value, int) or value <= 0:
        raise NotEstimable(f"the header does not say {key}")
    return value


def _kv_bytes_per_cell(facts: dict[str, object]) -> int:
    """F16 K and V for one cell, over every layer (grouped-query attention: only the KV heads)."""
    layers, embedding, heads = (_count(facts, key) for key in ("block_count", "embedding_length", "head_count"))
    kv_heads = facts.get("head_count_kv") or heads
    key_length = facts.get("key_length") or embedding // heads
    value_length = facts.get("value_length") or embedding // heads
    return layers * int(kv_heads) * (int(key_length) + int(value_length)) * KV_BYTES_PER_VALUE


def _compute_bytes(facts: dict[str, object], cells: int) -> int:
    """One micro-batch's activations with flash attention: the logits, the widest layer's
    intermediates, and the attention mask at full context (fitted to llama.cpp's reported
    compute buffers, tests/llama/test_estimate.py)."""
    vocab = facts.get("vocab_size") or 0
    width = int(facts.get("feed_forward_length") or 0) + 2 * _count(facts, "embedding_length")
    return UBATCH_TOKENS * 4 * (int(vocab) + width) + cells * UBATCH_TOKENS * 2


def _pad(tokens: int) -> int:
    return -(-tokens // CONTEXT_PAD) * CONTEXT_PAD


def estimate(
    facts: dict[str, object] | None,
    context_length: int | None,
    n_gpu_layers: int | None = None,
    gpu_free_bytes: list[int] | None = None,
) -> Estimate:
    """The deployment's memory on a worker with these GPUs' free memory (none: a CPU worker).

    On GPUs the offloaded layers' weights and KV cache are split in proportion to each one's free
    memory, as llama.cpp splits them; the token embeddings and layers left on the CPU stay in host
    memory and are not counted against a GPU.
    """
    if not facts:
        raise NotEstimable("no header facts: the artifact was acquired by an agent older than the estimate")
    if facts.get("problem"):
        raise NotEstimable(f"its header cannot be believed: {facts['problem']}")
    context = context_for(facts, context_length)
    cells = _pad(context)
    per_cell = _kv_bytes_per_cell(facts)
    weights = _count(facts, "weights_bytes")
    compute = _compute_bytes(facts, cells)
    gpus = [free for free in gpu_free_bytes or [] if free is not None]
    if not gpus or n_gpu_layers == 0:
        parts = {
            "weights": weights,
            "kv_cache": (cells + WRAPPER_CONTEXT_TOKENS) * per_cell,
            "engine": ENGINE_BYTES,
        }
        resident = sum(parts.values())
        return Estimate(resident, resident + compute, parts | {"compute": compute}, context, False, [])
    layers = _count(facts, "block_count")
    offloaded = layers if n_gpu_layers is None or n_gpu_layers < 0 else min(n_gpu_layers, layers)
    share = offloaded / layers
    layer_bytes = int(facts.get("layer_bytes") or 0)
    output = int(facts.get("other_bytes") or 0) if offloaded == layers else 0
    on_gpu = int(layer_bytes * share) + output
    kv = int((cells + WRAPPER_CONTEXT_TOKENS) * per_cell * share)
    parts = {"weights": on_gpu, "kv_cache": kv, "engine": GPU_RUNTIME_BYTES * len(gpus)}
    resident = sum(parts.values())
    total_free = sum(gpus) or 1
    per_gpu = [
        int((on_gpu + kv) * free / total_free) + GPU_RUNTIME_BYTES + (compute if index == 0 else 0)
        for index, free in enumerate(gpus)
    ]
    return Estimate(resident, resident + compute, parts | {"compute": compute}, context, True, per_gpu)


def correction_from(pairs: list[tuple[int, int]]) -> tuple[float, int]:
    """The median of measured / estimated resident bytes over past (estimated, measured) pairs,
    newest first, bounded; (1.0, 0) without history."""
    ratios = [
        measured / estimated for estimated, measured in pairs[:CORRECTION_HISTORY] if estimated > 0 and measured > 0
    ]
    if not ratios:
        return 1.0, 0
    low, high = CORRECTION_RANGE
    return max(low, min(statistics.median(ratios), high)), len(ratios)


def corrected(raw: Estimate, correction: float, corrected_by: int) -> Estimate:
    """`raw` scaled by the node's history; the compute buffer, not measured at load, is left as it is."""
    if corrected_by == 0:
        return raw
    compute = raw.peak_bytes - raw.resident_bytes
    resident = int(raw.resident_bytes * correction)
    return Estimate(
        resident,
        resident + compute,
        raw.parts,
        raw.context_length,
        raw.on_gpu,
        [int(each * correction) for each in raw.per_gpu_bytes],
        correction,
        corrected_by,
    )
