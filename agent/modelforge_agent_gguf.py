"""What a GGUF model file's header says, for the control plane's memory estimate (S3).

Read with the `gguf` package's reader (llama.cpp's own Python parser), never by loading weights:
the file is memory-mapped and only the header's bytes are touched. The reader is told not to make
a view of each tensor's data, so a file that declares more data than it holds is reported as such
rather than failing inside numpy. What a header may say is bounded: a file cut short inside its
metadata, tensors that end past the end of the file, absurd dimensions, or a layer count the
tensors do not bear out get a one-line `problem` instead of facts, never an exception.

The acquire job (modelforge_agent_acquire.py) describes each `.gguf` file it verified and sends
the descriptions with its result; the control plane keeps them with the artifact.
"""

from __future__ import annotations

import os
import re
from typing import Any

MODEL_SUFFIX = ".gguf"
MAX_MODEL_FILES = 64  # described per artifact; the rest are left out (and said so)
MAX_DIMENSION = 1 << 40  # one tensor dimension
MAX_ELEMENTS = 1 << 44  # one tensor's elements (16 Ti: far past any model, far short of overflow)
MAX_LAYERS = 4096
MAX_EMBEDDING = 1 << 20
MAX_CONTEXT = 1 << 24
_BLOCK = re.compile(r"blk\.(\d+)\.")
# Hyperparameters read from `<architecture>.<key>`, as llama.cpp names them.
_HYPERPARAMETERS = {
    "block_count": "block_count",
    "embedding_length": "embedding_length",
    "feed_forward_length": "feed_forward_length",
    "head_count": "attention.head_count",
    "head_count_kv": "attention.head_count_kv",
    "key_length": "attention.key_length",
    "value_length": "attention.value_length",
    "context_length": "context_length",
    "vocab_size": "vocab_size",
}


class HeaderProblem(ValueError):
    """The header cannot be believed; the message says why in one line."""


def _reader_class():
    """GGUFReader without tensor data views: only names, types, shapes and offsets are kept."""
    import gguf
    import numpy as np

    class HeaderReader(gguf.GGUFReader):
        def _build_tensors(self, start_offs: int, fields: list) -> None:
            self.tensor_infos = []
            seen: set[str] = set()
            for field in fields:
                _name_len, name_data, _n_dims, dims, raw_dtype, offset_tensor = field.parts
                name = bytes(name_data).decode("utf-8")
                if name in seen:
                    raise HeaderProblem(f"tensor {name[:80]!r} is declared twice")
                seen.add(name)
                try:
                    ggml_type = gguf.GGMLQuantizationType(int(raw_dtype[0]))
                except ValueError:
                    raise HeaderProblem(f"tensor {name[:80]!r} has unknown type {int(raw_dtype[0])}") from None
                shape = [int(dim) for dim in dims]
                if not shape or any(dim < 1 or dim > MAX_DIMENSION for dim in shape):
                    raise HeaderProblem(f"tensor {name[:80]!r} has absurd dimensions {shape[:4]}")
                elements = int(np.prod(shape, dtype=object))
                if elements > MAX_ELEMENTS:
                    raise HeaderProblem(f"tensor {name[:80]!r} declares {elements} elements")
                block_size, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
                if shape[0] % block_size:
                    raise HeaderProblem(f"tensor {name[:80]!r}: {shape[0]} is not a multiple of {block_size}")
                self.tensor_infos.append(
                    (name, ggml_type.name, elements * type_size // block_size, int(start_offs + offset_tensor[0]))
                )

    return HeaderReader


def _scalar(reader, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    import gguf

    if field.types and field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
        return len(field.data)
    value = field.parts[field.data[0]]
    return value.tolist()[0] if hasattr(value, "tolist") else value


def _positive(value: Any, key: str, limit: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit:
        raise HeaderProblem(f"{key} is {value!r}, not a count between 1 and {limit}")
    return value


def read_header(file: Any, size: int) -> dict[str, object]:
    """The facts of one GGUF file open for reading (`size` its length); HeaderProblem when the
    header cannot be believed."""
    reader_class = _reader_class()
    try:
        reader = reader_class(file)
    except HeaderProblem:
        raise
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError, TypeError, MemoryError) as error:
        text = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise HeaderProblem(f"the header cannot be read ({text}); the file may be cut short or not GGUF") from None
    architecture = _scalar(reader, "general.architecture")
    if not isinstance(architecture, str) or not re.fullmatch(r"[a-z0-9_.-]{1,64}", architecture):
        raise HeaderProblem("general.architecture is missing or not a name")
    facts: dict[str, object] = {"architecture": architecture, "file_bytes": size}
    for name, key in _HYPERPARAMETERS.items():
        limit = {"block_count": MAX_LAYERS, "embedding_length": MAX_EMBEDDING, "context_length": MAX_CONTEXT}
        facts[name] = _positive(
            _scalar(reader, f"{architecture}.{key}"), f"{architecture}.{key}", limit.get(name, MAX_DIMENSION)
        )
    if facts["vocab_size"] is None:
        facts["vocab_size"] = _positive(
            _scalar(reader, "tokenizer.ggml.tokens"), "tokenizer.ggml.tokens", MAX_DIMENSION
        )
    by_type: dict[str, int] = {}
    layers: set[int] = set()
    layer_bytes = input_bytes = data_end = 0
    for name, type_name, nbytes, offset in reader.tensor_infos:
        by_type[type_name] = by_type.get(type_name, 0) + nbytes
        data_end = max(data_end, offset + nbytes)
        if name.startswith("token_embd."):
            input_bytes += nbytes
        elif match := _BLOCK.match(name):
            layers.add(int(match.group(1)))
            layer_bytes += nbytes
    if data_end > size:
        raise HeaderProblem(
            f"its tensors end at byte {data_end} but the file holds {size}: the file is cut short or the header lies"
        )
    blocks = facts["block_count"]
    if blocks is not None and layers and blocks != len(layers):
        raise HeaderProblem(f"{architecture}.block_count says {blocks} layers but the tensors hold {len(layers)}")
    head_count, kv_heads = facts["head_count"], facts["head_count_kv"]
    if head_count and kv_heads and kv_heads > head_count:
        raise HeaderProblem(f"{kv_heads} KV heads for {head_count} attention heads")
    weights = sum(by_type.values())
    facts |= {
        "tensor_count": len(reader.tensor_infos),
        "weights_bytes": weights,
        "weights_by_type": dict(sorted(by_type.items())),
        "layer_bytes": layer_bytes,  # the repeating layers', split across GPUs by n_gpu_layers
        "input_bytes": input_bytes,  # the token embeddings, which llama.cpp keeps in host memory
        "other_bytes": weights - layer_bytes - input_bytes,  # the output layer and norms
    }
    return facts


def describe_file(dir_fd: int, relative: str) -> dict[str, object]:
    """One model file below `dir_fd`, reached without following a symlink: facts or `problem`."""
    parts = relative.split("/")
    fds: list[int] = []
    try:
        current = dir_fd
        for part in parts[:-1]:
            current = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
            fds.append(current)
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
        with os.fdopen(fd, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size == 0:
                return {"problem": "the file is empty"}
            return read_header(file, size)
    except HeaderProblem as problem:
        return {"problem": str(problem)}
    except OSError as error:
        return {"problem": f"the file cannot be read ({error.strerror})"}
    finally:
        for fd in fds:
            os.close(fd)


def describe_models(dir_fd: int, paths: list[str]) -> dict[str, dict[str, object]]:
    """Every `.gguf` among an artifact's files (relative paths), by path."""
    models = sorted(path for path in paths if path.lower().endswith(MODEL_SUFFIX))
    return {path: describe_file(dir_fd, path) for path in models[:MAX_MODEL_FILES]}
