"""Running the real node agent as a subprocess against a real control plane, and the agent in
process against a fake control plane that only records what it is sent."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests
from jsonschema import Draft202012Validator

import modelforge_node_agent as agent
from app.api import openapi
from tests.support import ADMIN, PROJECT_ROOT

FAKE_NVML_DIR = str(PROJECT_ROOT / "tests" / "support" / "fake_nvml")
CREDENTIAL = "mfn_" + "c" * 43
COMPATIBLE = {"answer": "COMPATIBLE", "protocol_version": 1, "supported": [1], "action": "None"}
# One idle RTX 4080 on PCI bus 01 as tests/support/fake_nvml reports it (vary it with {**FAKE_RTX_4080, ...}).
FAKE_RTX_4080 = {
    "uuid": "GPU-5f3b2c1a-0000-4000-8000-000000004080",
    "name": "NVIDIA GeForce RTX 4080",
    "memory_total": 17171480576,
    "memory_used": 734003200,
    "utilization": 7,
    "temperature": 38,
    "power_mw": 21500,
    "pci_bus_id": "00000000:01:00.0",
}


def fake_nvml_scenario(*gpus: dict) -> str:
    """A tests/support/fake_nvml scenario as JSON: driver 550.54.14, CUDA 12.4, and these GPUs."""
    return json.dumps({"driver": "550.54.14", "cuda": 12040, "gpus": list(gpus)})


# A node under test takes lab deployments and benchmarks (S3); a test that needs it otherwise says so.
WORKING_NODE = {"lab_eligible": True, "benchmark_eligible": True}


def mint_token(url: str, verify: bool | str = True, eligibility: dict[str, bool] | None = None) -> dict:
    """Mint an enrolment token through the admin API (a lab- and benchmark-eligible node by default)."""
    response = requests.post(
        url + "/api/v1/admin/node-enrollments",
        json={"display_name": "agent under test", "expires_in_seconds": 900, **WORKING_NODE, **(eligibility or {})},
        headers=ADMIN,
        timeout=10,
        verify=verify,
    )
    assert response.status_code == 201, response.text
    return response.json()


def without_permission_override() -> list[str]:
    """A command prefix that makes the agent obey file modes as any user does: as root (the tests'
    usual user) it drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (util-linux's setpriv), so a
    directory of mode 0555 really is not writable to it; nothing otherwise."""
    if os.geteuid() != 0:
        return []
    dropped = "-dac_override,-dac_read_search"
    return ["setpriv", f"--bounding-set={dropped}", f"--inh-caps={dropped}", "--"]


class AgentProcess:
    """`python -m modelforge_node_agent` with its own state and data directories; `prefix` runs it
    through another command (e.g. without_permission_override())."""

    def __init__(
        self, tmp_path: Path, control_plane_url: str, name: str = "agent", prefix: list[str] = (), **env: str
    ) -> None:
        self.prefix = list(prefix)
        self.home = tmp_path / name
        self.state_dir = self.home / "state"
        for directory in ("state", "hf-cache", "artifacts", "quarantine"):
            (self.home / directory).mkdir(parents=True, exist_ok=True)
        self.log_path = self.home / "agent.log"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": control_plane_url,
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
            "MODELFORGE_AGENT_HOSTNAME": f"{name}-host",
            "MODELFORGE_AGENT_STATE_DIR": str(self.state_dir),
            "MODELFORGE_AGENT_HF_CACHE_DIR": str(self.home / "hf-cache"),
            "MODELFORGE_AGENT_ARTIFACT_DIR": str(self.home / "artifacts"),
            "MODELFORGE_AGENT_QUARANTINE_DIR": str(self.home / "quarantine"),
            # W1: no runtime worker unless a test starts one, even if this machine runs one at the default.
            "MODELFORGE_AGENT_WORKER_SOCKET": "/nonexistent/modelforge-test-worker.sock",
            **env,
        }
        self.process: subprocess.Popen | None = None

    def with_fake_nvml(self, scenario: str) -> AgentProcess:
        """Put the fake pynvml first on the agent's path (no GPU on this machine)."""
        self.env["PYTHONPATH"] = FAKE_NVML_DIR
        self.env["FAKE_NVML_SCENARIO"] = scenario
        return self

    def start(self, *args: str) -> AgentProcess:
        """Start the agent in the background."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "modelforge_node_agent", *args],
                cwd=self.home,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def run(self, *args: str, timeout: float = 60) -> int:
        """Run the agent to completion; return its exit code."""
        self.start(*args)
        return self.process.wait(timeout=timeout)

    def wait_for(self, pattern: str, timeout: float = 30, count: int = 1) -> list[re.Match]:
        """Wait until the log holds `count` matches of `pattern`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            matches = list(re.finditer(pattern, self.log()))
            if len(matches) >= count:
                return matches
            if self.process and self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{pattern!r} x{count} not in the agent log within {timeout}s:\n{self.log()}")

    def stop(self, timeout: float = 5) -> float:
        """SIGTERM; return how long the agent took to exit."""
        if not self.process or self.process.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        return time.monotonic() - started

    def node_id(self) -> str:
        """The persisted node ID."""
        return (self.state_dir / "node-id").read_text().strip()

    def credential(self) -> str:
        """The stored credential (tests only read it to grep logs for it)."""
        return (self.state_dir / "node-credential").read_text().strip()

    def log(self) -> str:
        """What the agent printed."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""


def nvidia_agent(tmp_path: Path, server, scenario: str, name: str = "agent") -> tuple[AgentProcess, dict]:
    """An agent in nvidia mode on the fake NVML, holding a fresh token."""
    minted = mint_token(server.url)
    agent = AgentProcess(
        tmp_path,
        server.url,
        name=name,
        MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"],
        MODELFORGE_AGENT_ACCELERATOR_MODE="nvidia",
    ).with_fake_nvml(scenario)
    return agent, minted


class FakeControlPlane:
    """Records what the agent posts; answers each endpoint (claim, progress, …) from a script."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict, dict, float]] = []
        self.lock = threading.Lock()
        self.scripts = {
            "inventory": lambda body: (200, self.publication_reply(body)),
            "heartbeat": lambda body: (200, self.publication_reply(body)),
            "claim": lambda body: (204, None),
            "progress": lambda body: (200, {"lease_expires_at": "2030-01-01T00:00:00Z", "cancel_requested": False}),
            "complete": lambda body: (200, {}),
            "fail": lambda body: (200, {}),
        }
        self.jobs_waiting = 0
        self.roots: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                name = self.path.rsplit("/", 1)[1]
                with fake.lock:
                    fake.received.append((self.path, body, dict(self.headers), time.monotonic()))
                status, payload = fake.scripts[name](body)
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def publication_reply(self, body: dict) -> dict:
        reply = {"status": "accepted", "compatibility": COMPATIBLE, "heartbeat_interval_seconds": 1}
        reply["jobs_waiting"] = self.jobs_waiting
        if self.roots:
            reply["storage_roots_etag"] = "etag-1"
            if body.get("storage_roots_etag") != "etag-1":  # the list only when the agent's is out of date
                reply["storage_roots"] = self.roots
        return reply

    def bodies(self, name: str) -> list[dict]:
        with self.lock:
            return [body for path, body, _, _ in self.received if path.rsplit("/", 1)[1] == name]

    def names(self) -> list[str]:
        with self.lock:
            return [path.rsplit("/", 1)[1] for path, _, _, _ in self.received]

    def wait_for(self, name: str, count: int = 1, timeout: float = 15) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.bodies(name)) >= count:
                return self.bodies(name)
            time.sleep(0.02)
        raise AssertionError(f"no {count} {name} request(s) within {timeout}s: {self.names()}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def make_config(
    tmp_path: Path, control_plane_url: str, hub_url: str = agent.DEFAULT_HF_ENDPOINT, **extra: str
) -> agent.Config:
    """A CPU agent that already holds a credential (so it never enrols), with no runtime worker
    unless `extra` names its socket."""
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / "node-credential").write_text(CREDENTIAL)
    (tmp_path / "artifacts" / "registry").mkdir(parents=True, exist_ok=True)
    env = {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": control_plane_url,
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_STATE_DIR": str(tmp_path / "state"),
        "MODELFORGE_AGENT_ARTIFACT_DIR": str(tmp_path / "artifacts"),
        "MODELFORGE_AGENT_QUARANTINE_DIR": str(tmp_path / "quarantine"),
        "HF_ENDPOINT": hub_url,
        "MODELFORGE_AGENT_WORKER_SOCKET": str(tmp_path / "no-worker.sock"),  # W1: no runtime worker here
        **extra,
    }
    return agent.load_config(env)


def make_agent(config: agent.Config) -> agent.Agent:
    """The agent in process, CPU only, not yet started."""
    agent.ensure_state_dir(config)
    return agent.Agent(config, agent.Nvml(), agent.run_preflight("cpu", agent.Nvml(), {}), threading.Event())


def runner_for(config: agent.Config, job: dict) -> agent.JobRunner:
    """A runner for a claimed job (a claim reply's `job`), reporting to the config's control plane."""
    client = agent.Client(config)
    client.credential = CREDENTIAL
    return agent.JobRunner(agent.Job.from_claim(job), agent.JobsClient(client), config, threading.Event())


def assert_matches_the_servers_schema(body: dict, schema: str) -> None:
    """The body validates against the control plane's own OpenAPI schema (A5)."""
    root = {"$ref": f"#/components/schemas/{schema}", "components": openapi.document()["components"]}
    validator = Draft202012Validator(root, format_checker=Draft202012Validator.FORMAT_CHECKER)
    errors = [f"{list(error.path)}: {error.message}" for error in validator.iter_errors(body)]
    assert errors == [], (schema, errors)


def venv_checkout(directory: Path) -> Path:
    """A directory laid out as the checkout the bare-metal commands (the README's, the wizard's) run
    in: its `.venv/bin/python` is this interpreter, which has the agent installed."""
    python = directory / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n', encoding="utf-8")
    python.chmod(0o755)
    return directory
