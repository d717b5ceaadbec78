"""runtime.benchmark.v1 through the runtime worker against llama-cpp-python called directly (W2).

Starts the real worker (`python -m modelforge_runtime_worker`, CPU unless --accelerator says
otherwise) on a Unix socket and, in rounds, runs the same benchmark twice: once as a worker job
through the socket, once in this process with llama-cpp-python loaded directly and the same
settings (n_ctx = prompt + generate tokens, n_batch = prompt tokens, n_ubatch 512, seed 42), measured
by the same procedure (the worker module's `measure_benchmark`: warm-up, `repetitions` prompt
batches after a KV clear, `repetitions` runs of single-token decodes, tokens/s each). The two
never run at once; rounds alternate which goes first. Prints, per side, prompt processing and
generation tokens/s (median of the rounds' means) and the ratio worker/direct (target ≥ 0.95: the
socket, the job thread, the cancel checks and the memory sampler must cost next to nothing), then
the worker's resident set (VmRSS from /proc/<pid>/status): just after start (llama_cpp not yet
imported), after GET /v1/info (engine imported, no model), and after the jobs finished (model
freed), with its peak during a job as the job reported it.

    .venv/bin/python bench/runtime.py [--model PATH.gguf] [--prompt-tokens 512]
                                      [--generate-tokens 128] [--repetitions 5] [--rounds 3]
    .venv/bin/python bench/runtime.py --prompt-tokens 64 --generate-tokens 16 --rounds 2   # quick

Without --model it writes the tiny random-weight llama of tests/support/tiny_gguf.py (about 0.5 MB), whose
figures are dominated by per-call overhead: the harshest case for the worker's share.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from modelforge_runtime_worker import SEED, measure_benchmark  # noqa: E402

from tests.support.tiny_gguf import write_tiny_llama  # noqa: E402
from tests.support.worker import call  # noqa: E402

POLL_SECONDS = 0.2  # slow polling: this process shares the CPU with the worker it measures


def vm_rss(pid: int) -> int:
    """A process's resident set now, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def start_worker(socket_path: Path, artifact_dir: Path, mode: str, log_path: Path) -> subprocess.Popen:
    """Start the worker; return once its socket accepts a connection (no request sent yet)."""
    env = {
        **os.environ,
        "MODELFORGE_WORKER_SOCKET": str(socket_path),
        "MODELFORGE_WORKER_ARTIFACT_DIR": str(artifact_dir),
        "MODELFORGE_WORKER_ACCELERATOR_MODE": mode,
    }
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "modelforge_runtime_worker"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise SystemExit(f"the worker exited {process.returncode}:\n{log_path.read_text()}")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(socket_path))
            return process
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("the worker did not listen within 30 s") from None
            time.sleep(0.05)
        finally:
            probe.close()


def worker_round(socket_path: Path, model_path: str, args: argparse.Namespace) -> dict:
    """One benchmark job through the socket; its result."""
    params = {
        "artifact_id": "bench",
        "model_file": Path(model_path).name,
        "model_path": model_path,
        "prompt_tokens": args.prompt_tokens,
        "generate_tokens": args.generate_tokens,
        "repetitions": args.repetitions,
    }
    if args.n_gpu_layers is not None:
        params["n_gpu_layers"] = args.n_gpu_layers
    job_id = str(uuid.uuid4())
    body = {"id": job_id, "type": "runtime.benchmark.v1", "params": params}
    code, status = call(socket_path, "POST", "/v1/jobs", body)
    if code != 202:
        raise SystemExit(f"the worker refused the job: {code} {status}")
    while status["state"] == "running":
        time.sleep(POLL_SECONDS)
        status = call(socket_path, "GET", f"/v1/jobs/{job_id}")[1]
    if status["state"] != "succeeded":
        raise SystemExit(f"the job {status['state']}: {status['error']}")
    return status["result"]


def direct_round(model: Path, n_gpu_layers: int, args: argparse.Namespace) -> dict:
    """The same benchmark with llama-cpp-python loaded in this process."""
    import llama_cpp

    start = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=str(model),
        n_gpu_layers=n_gpu_layers,
        n_ctx=args.prompt_tokens + args.generate_tokens,
        n_batch=args.prompt_tokens,
        n_ubatch=min(args.prompt_tokens, 512),  # llama-bench's default micro-batch
        seed=SEED,
        verbose=False,
    )
    load_seconds = time.perf_counter() - start
    try:
        figures = measure_benchmark(llm, llama_cpp, args.prompt_tokens, args.generate_tokens, args.repetitions)
    finally:
        llm.close()
        del llm
    return {**figures, "load_seconds": load_seconds}


def median_of(results: list[dict], figure: str) -> float:
    """The median over rounds of each round's mean tokens/s (a round disturbed by other load counts once)."""
    return statistics.median(result[figure]["mean"] for result in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a GGUF file (default: the tiny test model)")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--generate-tokens", type=int, default=128)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n-gpu-layers", type=int, help="default: the worker's (all on a GPU, 0 on CPU)")
    parser.add_argument("--accelerator", choices=("cpu", "auto", "nvidia"), default="cpu")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="mfbench-", dir="/tmp"))
    worker = None
    try:
        if args.model:
            model = args.model.resolve()
        else:
            model = write_tiny_llama(scratch / "tiny.gguf")
        socket_path = scratch / "w.sock"
        worker = start_worker(socket_path, model.parent, args.accelerator, scratch / "worker.log")
        rss_started = vm_rss(worker.pid)
        info = call(socket_path, "GET", "/v1/info")[1]
        rss_info = vm_rss(worker.pid)
        engine = info["engines"][0]

        worker_results, direct_results = [], []
        for round_number in range(args.rounds):
            sides = ["worker", "direct"] if round_number % 2 == 0 else ["direct", "worker"]
            for side in sides:
                if side == "worker":
                    worker_results.append(worker_round(socket_path, model.name, args))
                else:
                    layers = worker_results[-1]["n_gpu_layers"] if worker_results else (args.n_gpu_layers or 0)
                    direct_results.append(direct_round(model, layers, args))
        rss_after = vm_rss(worker.pid)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)

        layers = worker_results[0]["n_gpu_layers"]
        print(f"model {model.name} ({model.stat().st_size:,} bytes), {engine['name']} {engine['version']} ", end="")
        print(f"{engine['backend']}, n_gpu_layers {layers}, {os.cpu_count()} CPUs")
        print(f"pp{args.prompt_tokens}, tg{args.generate_tokens}: {args.repetitions} repetitions, {args.rounds} rounds")
        print(f"load average at the end {os.getloadavg()[0]:.2f} (figures are only comparable on a quiet machine)")
        print()
        print(f"{'tokens/s':<24}{'worker':>12}{'direct':>12}{'worker/direct':>16}")
        for label, figure in (
            (f"pp{args.prompt_tokens}", "prompt_tokens_per_second"),
            (f"tg{args.generate_tokens}", "generate_tokens_per_second"),
        ):
            via_worker, direct = median_of(worker_results, figure), median_of(direct_results, figure)
            print(f"{label:<24}{via_worker:>12.1f}{direct:>12.1f}{via_worker / direct:>16.3f}")
        ttft_worker = statistics.median(result["time_to_first_token_seconds"] for result in worker_results)
        ttft_direct = statistics.median(result["time_to_first_token_seconds"] for result in direct_results)
        print(f"{'time to first token, s':<24}{ttft_worker:>12.4f}{ttft_direct:>12.4f}")
        load_worker = statistics.median(result["load_seconds"] for result in worker_results)
        load_direct = statistics.median(result["load_seconds"] for result in direct_results)
        print(f"{'load, s':<24}{load_worker:>12.4f}{load_direct:>12.4f}")
        print()
        mib = 1024 * 1024
        print("worker VmRSS, MiB")
        print(f"  after start (no engine)      {rss_started / mib:8.1f}")
        print(f"  after /v1/info (engine)      {rss_info / mib:8.1f}")
        print(f"  after {len(worker_results)} jobs (model freed)  {rss_after / mib:8.1f}")
        peak = max(result["peak_rss_bytes"] for result in worker_results)
        print(f"  peak during a job (reported) {peak / mib:8.1f}")
        return 0
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
