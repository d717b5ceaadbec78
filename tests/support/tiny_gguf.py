"""A tiny random-weight llama model in GGUF, for tests and benchmarks that need a real model file.

llama.cpp loads it and generates from it like from any llama model; it is a few hundred KiB, so a
load takes milliseconds and a benchmark run well under a second on a CPU. The bytes depend only on
the seed: the same seed gives the same file, and the same file gives the same text at
temperature 0.

Beside it, hostile files that pass any hash or manifest check (issue 22): llama.cpp aborts the
process (`std::out_of_range`, SIGABRT) on a vocabulary that repeats a token, and on a prompt
character that needs a byte-fallback token the vocabulary lacks (a newline is enough); a file cut
short and one with absurd dimensions must fail cleanly. The worker runs each model in a child
process, so none of them may take it down.

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


def vocabulary(
    *, byte_tokens: bool = True, repeat: str | None = None, extra: int = 0
) -> tuple[list[str], list[float], list[int]]:
    """An SPM vocabulary: control tokens, 256 byte fallbacks, then letters, pieces and words.

    llama.cpp needs every `<0xNN>` byte token and the bare `▁` here, or it aborts on the first
    prompt character it cannot spell (a newline); and it aborts on a token listed twice. The
    hostile writers below ask for exactly that: `byte_tokens=False` leaves the byte tokens out,
    `repeat` lists that piece a second time. `extra` adds that many words, for a larger model.
    """
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    if byte_tokens:
        tokens += [f"<0x{byte:02X}>" for byte in range(256)]
        types += [gguf.TokenType.BYTE] * 256
    normal = [SPACE, *string.ascii_letters, *string.digits, *".,!?;:'-()"]
    normal += [SPACE + letter for letter in string.ascii_lowercase]
    normal += list(PIECES) + [SPACE + word for word in WORDS]
    normal += [f"{SPACE}w{index}" for index in range(extra)]  # a larger vocabulary, for size
    assert len(set(normal)) == len(normal), "llama.cpp aborts on a vocabulary with a repeated token"
    if repeat is not None:
        assert repeat in normal, repeat
        normal.append(repeat)
    tokens += normal
    types += [gguf.TokenType.NORMAL] * len(normal)
    # SPM merges the pair whose piece scores highest: longer pieces first, then earlier ones.
    scores = [0.0] * (len(tokens) - len(normal))
    scores += [len(piece) - index / 1000 for index, piece in enumerate(normal)]
    return tokens, scores, [int(kind) for kind in types]


# The weight types a model can be written in (S3's estimate is checked against F16 and Q8_0 too);
# norms stay F32, as converters leave them.
WEIGHT_TYPES = {
    "F32": gguf.GGMLQuantizationType.F32,
    "F16": gguf.GGMLQuantizationType.F16,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
}
FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}


def _weights(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A (rows, cols) float32 matrix of small random weights (GGUF stores it as cols × rows)."""
    return (rng.standard_normal((rows, cols), dtype=np.float32) * WEIGHT_SCALE).astype(np.float32)


def _add_matrix(writer: gguf.GGUFWriter, name: str, matrix: np.ndarray, weight_type: str) -> None:
    qtype = WEIGHT_TYPES[weight_type]
    writer.add_tensor(name, gguf.quants.quantize(matrix, qtype), raw_dtype=qtype)


def write_tiny_llama(
    path: str | Path,
    seed: int = 0,
    *,
    n_layer: int = N_LAYER,
    n_embd: int = N_EMBD,
    byte_tokens: bool = True,
    repeat: str | None = None,
    block_count: int | None = None,
    chat_template: str | None = None,
    n_head: int = N_HEAD,
    n_head_kv: int | None = None,
    n_ff: int = N_FF,
    extra_vocab: int = 0,
    weight_type: str = "F32",
) -> Path:
    """Write a random-weight llama GGUF to ``path``; the same seed gives the same bytes.

    `byte_tokens` and `repeat` shape the vocabulary (see vocabulary()); `block_count` is the layer
    count the metadata claims, `n_layer` by default (the tensors are always `n_layer`'s);
    `chat_template` is stored as the model's Jinja chat template. The rest size the model, for
    tests of memory estimates (S3): heads, KV heads (grouped-query attention when fewer), the
    feed-forward width, extra vocabulary, and the matrices' type (WEIGHT_TYPES).
    """
    n_head_kv = n_head if n_head_kv is None else n_head_kv
    head_dim = n_embd // n_head
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary(byte_tokens=byte_tokens, repeat=repeat, extra=extra_vocab)
    n_vocab = len(tokens)
    n_special = 3 + (256 if byte_tokens else 0)

    writer = gguf.GGUFWriter(path, ARCHITECTURE)
    writer.add_name(f"modelforge-tiny-llama-seed{seed}")
    writer.add_file_type(FILE_TYPES[weight_type])
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer if block_count is None else block_count)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
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
    if chat_template is not None:  # tokenizer.chat_template, as converted models carry it
        writer.add_chat_template(chat_template)

    ones = np.ones(n_embd, dtype=np.float32)
    _add_matrix(writer, "token_embd.weight", _weights(rng, n_vocab, n_embd), weight_type)
    kv_width = n_head_kv * head_dim
    for layer in range(n_layer):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", ones)
        for name, rows in (("attn_q", n_embd), ("attn_k", kv_width), ("attn_v", kv_width), ("attn_output", n_embd)):
            _add_matrix(writer, f"{block}.{name}.weight", _weights(rng, rows, n_embd), weight_type)
        writer.add_tensor(f"{block}.ffn_norm.weight", ones)
        _add_matrix(writer, f"{block}.ffn_gate.weight", _weights(rng, n_ff, n_embd), weight_type)
        _add_matrix(writer, f"{block}.ffn_up.weight", _weights(rng, n_ff, n_embd), weight_type)
        _add_matrix(writer, f"{block}.ffn_down.weight", _weights(rng, n_embd, n_ff), weight_type)
    writer.add_tensor("output_norm.weight", ones)
    output = _weights(rng, n_vocab, n_embd) * 4
    # Control and byte tokens get zero logits, so greedy decoding picks readable pieces and never
    # stops early: generated text is printable and every completion runs to max_tokens.
    output[:n_special] = 0.0
    _add_matrix(writer, "output.weight", output, weight_type)

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


def write_truncated_header(path: str | Path, seed: int = 0) -> Path:
    """Write a tiny llama GGUF cut off inside its metadata (the tokenizer's list of tokens)."""
    path = write_tiny_llama(path, seed)
    data = path.read_bytes()
    path.write_bytes(data[: data.index(b"<0x41>")])
    return path


def write_repeated_token(path: str | Path, seed: int = 0) -> Path:
    """Hostile: a vocabulary that lists one token twice; llama.cpp aborts the process loading it."""
    return write_tiny_llama(path, seed, repeat=SPACE + "the")


def write_without_byte_tokens(path: str | Path, seed: int = 0) -> Path:
    """Hostile: no `<0xNN>` byte-fallback tokens. It loads and benchmarks, but a prompt with a
    character the vocabulary cannot spell (a newline) aborts the process tokenizing it."""
    return write_tiny_llama(path, seed, byte_tokens=False)


def write_absurd_dimensions(path: str | Path, seed: int = 0) -> Path:
    """Hostile: metadata that claims 2**31 - 1 layers for a file holding two."""
    return write_tiny_llama(path, seed, block_count=2**31 - 1)


# Every malformed model the tests write, by file name: hash and manifest checks pass them all.
MALFORMED = {
    "repeated-token.gguf": write_repeated_token,
    "no-byte-tokens.gguf": write_without_byte_tokens,
    "truncated-data.gguf": write_truncated,
    "truncated-header.gguf": write_truncated_header,
    "absurd-dimensions.gguf": write_absurd_dimensions,
}


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
