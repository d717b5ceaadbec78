"""Several clients of one loaded model: a queue (one sequence, one request after another) against
llama.cpp's parallel sequences ("slots", one batch holds a token of every request), in-process (W1, S5).

Both sides drive llama.cpp the same way, through llama-cpp-python's low-level API on one loaded
model: greedy decoding, `--tokens` tokens after the same prompt for each of `--clients` clients
who all ask at once. The queue side decodes one request to its end before it starts the next
(what the runtime worker did until this measurement); the slots side gives each client its own
sequence in one context (n_seq_max = clients, each sequence its own share of the KV cache) and
decodes one token of every unfinished sequence per llama_decode call, the prompts batched
together first, as llama.cpp's own server does. Rounds alternate which side goes first.

Prints, per side: aggregate tokens/s, time to first token (median and worst client), each
client's tokens/s while it streams, and the time until the last client is answered; then whether
both sides produced the same tokens for every client, and how far they agree (greedy; llama.cpp's
batched kernels add in another order, so a near tie can flip).

    .venv/bin/python bench/slots.py [--clients 8] [--tokens 128] [--rounds 3] [--layers 8] [--embd 768]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

import numpy as np  # noqa: E402

from tests.support.tiny_gguf import write_tiny_llama  # noqa: E402

PROMPT = "Once upon a time, in a small lab behind a slow uplink,"


class Engine:
    """One loaded model and one context with `sequences` sequences of `per_sequence` tokens each."""

    def __init__(self, llama_cpp, llm, sequences: int, per_sequence: int) -> None:
        self.lib = llama_cpp
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = sequences * per_sequence
        params.n_batch = max(512, sequences * per_sequence)
        params.n_ubatch = 512
        params.n_seq_max = sequences
        params.n_threads = params.n_threads_batch = os.cpu_count() or 1
        self.ctx = llama_cpp.llama_init_from_model(llm.model, params)
        if not self.ctx:
            raise SystemExit("llama.cpp could not make the context")
        self.n_vocab = llm.n_vocab()
        self.batch = llama_cpp.llama_batch_init(params.n_batch, 0, sequences)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence, wants logits) entries."""
        batch = self.batch
        for index, (token, position, sequence, logits) in enumerate(entries):
            batch.token[index] = token
            batch.pos[index] = position
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = sequence
            batch.logits[index] = logits
        batch.n_tokens = len(entries)
        if self.lib.llama_decode(self.ctx, batch) != 0:
            raise SystemExit("llama_decode failed")

    def greedy(self, index: int) -> int:
        """The most likely next token from the logits of batch entry `index`."""
        pointer = self.lib.llama_get_logits_ith(self.ctx, index)
        row = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        return int(row.argmax())

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)


class Client:
    def __init__(self, started: float) -> None:
        self.started = started
        self.stamps: list[float] = []
        self.tokens: list[int] = []

    def take(self, token: int) -> None:
        self.stamps.append(time.perf_counter())
        self.tokens.append(token)


def queued(engine: Engine, prompt: list[int], clients: int, tokens: int) -> list[Client]:
    """Every client asks at once; each is answered whole before the next starts."""
    started = time.perf_counter()
    answered = [Client(started) for _ in range(clients)]
    for client in answered:
        engine.clear()
        engine.decode([(token, position, 0, position == len(prompt) - 1) for position, token in enumerate(prompt)])
        token = engine.greedy(len(prompt) - 1)
        client.take(token)
        for position in range(len(prompt), len(prompt) + tokens - 1):
            engine.decode([(token, position, 0, True)])
            token = engine.greedy(0)
            client.take(token)
    return answered


def slotted(engine: Engine, prompt: list[int], clients: int, tokens: int) -> list[Client]:
    """Every client asks at once; one batch carries a token of each, the prompts all in the first."""
    started = time.perf_counter()
    answered = [Client(started) for _ in range(clients)]
    engine.clear()
    last = len(prompt) - 1
    engine.decode(
        [(token, position, seq, position == last) for seq in range(clients) for position, token in enumerate(prompt)]
    )
    for seq, client in enumerate(answered):
        client.take(engine.greedy(seq * len(prompt) + last))
    for position in range(len(prompt), len(prompt) + tokens - 1):
        engine.decode([(client.tokens[-1], position, seq, True) for seq, client in enumerate(answered)])
        for seq, client in enumerate(answered):
            client.take(engine.greedy(seq))
    return answered


def summary(clients: list[Client]) -> dict[str, float]:
    first = [client.stamps[0] - client.started for client in clients]
    end = max(client.stamps[-1] for client in clients) - clients[0].started
    rates = [(len(client.stamps) - 1) / (client.stamps[-1] - client.stamps[0]) for client in clients]
    return {
        "aggregate": sum(len(client.stamps) for client in clients) / end,
        "ttft_p50": statistics.median(first),
        "ttft_max": max(first),
        "stream_rate": statistics.median(rates),
        "last_done": end,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8, help="layers of the random llama written")
    parser.add_argument("--embd", type=int, default=768, help="its embedding width")
    parser.add_argument("--model", type=Path, help="a GGUF file instead of the random llama")
    args = parser.parse_args()

    import llama_cpp

    scratch = Path(tempfile.mkdtemp(prefix="mfslots-", dir="/tmp"))
    try:
        model = args.model or write_tiny_llama(scratch / "tiny.gguf", n_layer=args.layers, n_embd=args.embd)
        llm = llama_cpp.Llama(model_path=str(model), n_ctx=64, n_gpu_layers=0, verbose=False)
        prompt = llm.tokenize(PROMPT.encode(), add_bos=True)
        per_sequence = -(-(len(prompt) + args.tokens) // 256) * 256  # llama.cpp pads a context to 256
        sides = {
            "queue": (Engine(llama_cpp, llm, 1, per_sequence), queued),
            "slots": (Engine(llama_cpp, llm, args.clients, per_sequence), slotted),
        }
        results: dict[str, list[dict]] = {name: [] for name in sides}
        texts: dict[str, list[list[int]]] = {}
        for round_number in range(args.rounds + 1):  # the first round warms both and is not counted
            order = list(sides) if round_number % 2 == 0 else list(reversed(sides))
            for name in order:
                engine, run = sides[name]
                clients = run(engine, prompt, args.clients, args.tokens)
                texts[name] = [client.tokens for client in clients]
                if round_number:
                    results[name].append(summary(clients))
        for engine, _ in sides.values():
            engine.close()
        llm.close()

        size = model.stat().st_size / 2**20
        print(f"model {size:.0f} MiB, {args.clients} clients x {args.tokens} tokens, ", end="")
        print(f"each after the same {len(prompt)}-token prompt, ", end="")
        print(f"{args.rounds} rounds, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
        agree = [
            next((index for index, (a, b) in enumerate(zip(one, other, strict=True)) if a != b), len(one))
            for one, other in zip(texts["queue"], texts["slots"], strict=True)
        ]
        same = sum(count == args.tokens for count in agree)
        print(f"the same tokens on both sides: {same} of {args.clients} clients; ", end="")
        print(f"the first to differ is token {min(agree)} (median {statistics.median(agree):.0f})")
        print()
        columns = ("aggregate tok/s", 16), ("TTFT p50 ms", 13), ("TTFT max ms", 13), ("per-stream tok/s", 18)
        print(f"{'':<8}" + "".join(f"{title:>{width}}" for title, width in columns) + f"{'last done s':>13}")
        for name, rounds in results.items():
            figure = {key: statistics.median(each[key] for each in rounds) for key in rounds[0]}
            print(
                f"{name:<8}{figure['aggregate']:>16.1f}"
                f"{figure['ttft_p50'] * 1000:>13.1f}{figure['ttft_max'] * 1000:>13.1f}"
                f"{figure['stream_rate']:>18.1f}{figure['last_done']:>13.2f}"
            )
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
