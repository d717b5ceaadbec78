"""A tiny random-weight llama model in GGUF, for tests and benchmarks that need a real model file.

llama.cpp loads it and generates from it like from any llama model; it is a few hundred KiB, so a
load takes milliseconds and a benchmark run well under a second on a CPU. The bytes depend only on
the seed: the same seed gives the same file, and the same file gives the same text at
temperature 0.

    python tests/support/tiny_gguf.py OUT.gguf [--seed N]
"""

from __future__ import annotations

import argparse
import string
from pathlib import Path

import gguf
import numpy as np

ARCHITECTURE = "llama"
N_LAYER = 2
N_EMBD = 64
N_HEAD = 4
N_FF = 128
CONTEXT_LENGTH = 2048
RMS_EPS = 1e-5
ROPE_FREQ_BASE = 10000.0
WEIGHT_SCALE = 0.08

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SPACE = "\u2581"  # SentencePiece's word-start mark
WORDS = (
    "the", "and", "model", "forge", "node", "worker", "hello", "world", "token", "fast",
    "small", "test", "runs", "on", "GPU", "CPU", "of", "to", "is", "it", "in", "for",
)  # fmt: skip
PIECES = ("er", "on", "an", "re", "in", "th", "es", "or", "ing", "ed")


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """An SPM vocabulary: control tokens, 256 byte fallbacks, then letters, pieces and words."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    normal = [SPACE, *string.ascii_letters, *string.digits, *".,!?;:'-()"]
    normal += [SPACE + letter for letter in string.ascii_lowercase]
    normal += list(PIECES) + [SPACE + word for word in WORDS]
    assert len(set(normal)) == len(normal), "llama.cpp aborts on a vocabulary with a repeated token"
    tokens += normal
    types += [gguf.TokenType.NORMAL] * len(normal)
    # SPM merges the pair whose piece scores highest: longer pieces first, then earlier ones.
    scores = [0.0] * (len(tokens) - len(normal))
    scores += [len(piece) - index / 1000 for index, piece in enumerate(normal)]
    return tokens, scores, [int(kind) for kind in types]


def _weights(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A (rows, cols) float32 matrix of small random weights (GGUF stores it as cols × rows)."""
    return (rng.standard_normal((rows, cols)) * WEIGHT_SCALE).astype(np.float32)


def write_tiny_llama(path: str | Path, seed: int = 0, *, n_layer: int = N_LAYER, n_embd: int = N_EMBD) -> Path:
    """Write a random-weight llama GGUF to ``path``; the same seed gives the same bytes."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)

    writer = gguf.GGUFWriter(path, ARCHITECTURE)
    writer.add_name(f"modelforge-tiny-llama-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(n_embd // N_HEAD)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    ones = np.ones(n_embd, dtype=np.float32)
    writer.add_tensor("token_embd.weight", _weights(rng, n_vocab, n_embd))
    for layer in range(n_layer):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", _weights(rng, n_embd, n_embd))
        writer.add_tensor(f"{block}.ffn_norm.weight", ones)
        writer.add_tensor(f"{block}.ffn_gate.weight", _weights(rng, N_FF, n_embd))
        writer.add_tensor(f"{block}.ffn_up.weight", _weights(rng, N_FF, n_embd))
        writer.add_tensor(f"{block}.ffn_down.weight", _weights(rng, n_embd, N_FF))
    writer.add_tensor("output_norm.weight", ones)
    output = _weights(rng, n_vocab, n_embd) * 4
    # Control and byte tokens get zero logits, so greedy decoding picks readable pieces and never
    # stops early: generated text is printable and every completion runs to max_tokens.
    output[: 3 + 256] = 0.0
    writer.add_tensor("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_truncated(path: str | Path, seed: int = 0) -> Path:
    """Write a tiny llama GGUF cut off halfway through its tensor data (the header is intact)."""
    path = write_tiny_llama(path, seed)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def write_not_gguf(path: str | Path) -> Path:
    """Write a file that is not GGUF at all (wrong magic bytes)."""
    path = Path(path)
    path.write_bytes(b"PK\x03\x04 this is a zip header, not a model\n" * 64)
    return path


def main(argv: list[str] | None = None) -> int:
    """Write one tiny model where the command line says."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = write_tiny_llama(args.path, args.seed)
    print(f"{path} {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
