"""The node-agent and runtime-worker images, built and run for real with podman (D2, D4, W1-W3,
I1–I3, P1).

No image registry can be reached here, so the production bases are swapped through the
Dockerfile's build arguments for a Debian bookworm base this test makes with debootstrap
(minbase, python3, ca-certificates) and `podman import`. The build stage's base also gets pip
and this machine's CA bundle, because PyPI is reached through the same TLS proxy as on the host.
Both bases are kept by podman between runs.

The runtime worker's CPU image is built from deploy/Dockerfile.runtime-worker-cpu on the same
bases; its build stage installs the compiler and CMake itself with apt (as it does on the
production base), and pip there is told to trust the same CA bundle. The first build compiles
llama.cpp (many minutes on two cores); podman keeps that layer, so later builds only copy the
worker's module.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import requests

from tests.support import ADMIN, OPERATOR_KEY, PROJECT_ROOT, assert_no_secrets, free_port
from tests.support.agent import AgentProcess, mint_token
from tests.support.containers import (
    BUILD_BASE,
    CONTROL_PLANE_IMAGE,
    RUNTIME_BASE,
    build_control_plane_image,
    ensure_bases,
    image_exists,
    podman,
)

AGENT_IMAGE = "localhost/modelforge-node-agent:test"
WORKER_BUILD_BASE = "localhost/modelforge-test-worker-build-base:bookworm"
WORKER_IMAGE = "localhost/modelforge-runtime-worker-cpu:test"
# pip in the build stage's venv reads /etc/pip.conf: the host's CA bundle is already in the base.
WORKER_BUILD_BASE_CONTAINERFILE = f"""\
FROM {BUILD_BASE}
RUN printf '[global]\\ncert = /etc/ssl/certs/ca-certificates.crt\\n' > /etc/pip.conf
"""
# The first build compiles llama.cpp; later ones reuse that layer.
WORKER_BUILD_TIMEOUT = 3600
PODMAN_MANAGED = {"C /etc", "A /etc/hosts", "A /etc/hostname", "A /etc/resolv.conf", "C /run", "A /run/.containerenv"}
HARDENING = [
    "--read-only",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
    "--tmpfs=/tmp:size=16m,mode=1777",
]


@pytest.fixture(scope="session")
def agent_image():
    """The agent image from deploy/Dockerfile.node-agent, production bases swapped."""
    ensure_bases()
    podman(
        "build",
        "-f",
        str(PROJECT_ROOT / "deploy/Dockerfile.node-agent"),
        "--build-arg",
        f"BUILD_IMAGE={BUILD_BASE}",
        "--build-arg",
        f"RUNTIME_IMAGE={RUNTIME_BASE}",
        "--build-arg",
        "REVISION=test",
        "-t",
        AGENT_IMAGE,
        str(PROJECT_ROOT),
    )
    return AGENT_IMAGE


class Container:
    """One run of the agent image, hardened exactly as the compose file asks."""

    def __init__(self, name: str, volume: str, control_plane_url: str, **env: str) -> None:
        self.name, self.volume = name, volume
        self.env = {
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": control_plane_url,
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
            "MODELFORGE_AGENT_HOSTNAME": "container-node",
            **env,
        }

    def start(self) -> Container:
        podman("rm", "-f", self.name, check=False)
        env_args = [f"--env={key}={value}" for key, value in self.env.items()]
        podman(
            "run", "-d", f"--name={self.name}", "--network=host", *HARDENING,
            f"--volume={self.volume}:/data/state", *env_args, AGENT_IMAGE,
        )  # fmt: skip
        return self

    def logs(self) -> str:
        result = podman("logs", self.name, check=False)
        return result.stdout + result.stderr

    def wait_for(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.logs():
                return
            time.sleep(0.3)
        raise AssertionError(f"{text!r} not in the container log:\n{self.logs()}")

    def remove(self) -> None:
        podman("stop", "-t", "5", self.name, check=False)
        podman("rm", "-f", self.name, check=False)


def test_hardened_agent_container_enrols_goes_online_and_keeps_its_identity(agent_image, agent_server):
    suffix = os.urandom(4).hex()
    volume = f"modelforge-test-state-{suffix}"
    podman("volume", "create", volume)
    minted = mint_token(agent_server.url)
    first = Container(f"mf-agent-{suffix}", volume, agent_server.url, MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"])
    try:
        first.start().wait_for("inventory published")
        inspect = podman("inspect", first.name, "--format", "{{.HostConfig.ReadonlyRootfs}} {{.HostConfig.CapDrop}}")
        assert inspect.stdout.split()[0] == "true"
        user = podman("exec", first.name, "python3", "-c", "import os; print(os.getuid())")
        assert user.stdout.strip() == "65532"  # not root
        # J3: the image carries what artifact.acquire.v1 imports, and the agent advertises it.
        version = "import huggingface_hub, httpx2; print(huggingface_hub.__version__)"
        hub = podman("exec", first.name, "python3", "-c", version)
        assert hub.stdout.strip() == "2.4.0", hub.stderr
        # Nothing written outside the state volume and the tmpfs: the only differences are the
        # files podman itself mounts into every container.
        changes = set(podman("diff", first.name).stdout.split("\n")) - {""}
        assert changes <= PODMAN_MANAGED, changes - PODMAN_MANAGED
        node_id = podman(
            "exec", first.name, "python3", "-c", "print(open('/data/state/node-id').read())"
        ).stdout.strip()
        node = requests.get(f"{agent_server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10).json()
        assert node["hostname"] == "container-node" and node["agent_version"] == "0.1.0"
        deadline = time.monotonic() + 15
        while node["status"] != "online" and time.monotonic() < deadline:
            time.sleep(0.5)
            node = requests.get(f"{agent_server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10).json()
        assert node["status"] == "online"
        assert node["capabilities"] == ["artifact.acquire.v1", "artifact.delete.v1"]
        first_logs = first.logs()
        first.remove()

        # I3: recreated without the token, on the same state volume: same identity.
        second = Container(f"mf-agent-{suffix}", volume, agent_server.url).start()
        second.wait_for("starting with its stored credential")
        assert f"node {node_id} starting" in second.logs()
        listed = requests.get(f"{agent_server.url}/api/v1/hardware/nodes", headers=ADMIN, timeout=10).json()["nodes"]
        assert [item["id"] for item in listed] == [node_id]
        second_logs = second.logs()
        second.remove()
    finally:
        first.remove()
        podman("volume", "rm", "-f", volume, check=False)
    agent_server.stop()
    assert_no_secrets(first_logs + second_logs + agent_server.log(), minted["token"])


def test_agent_image_has_no_nvidia_library_baked_in(agent_image):
    listing = podman("run", "--rm", "--entrypoint", "python3", agent_image, "-c",
                     "import glob; print(glob.glob('/usr/lib/**/libnvidia-ml*', recursive=True))")  # fmt: skip
    assert listing.stdout.strip() == "[]"
    preflight = podman("run", "--rm", "--network=none", "--env=MODELFORGE_AGENT_ACCELERATOR_MODE=nvidia",
                       agent_image, "--preflight", check=False)  # fmt: skip
    assert preflight.returncode == 3
    assert "NVIDIA_NVML_UNAVAILABLE" in preflight.stdout + preflight.stderr


NVIDIA_CDI_STUB = """cdiVersion: "0.5.0"
kind: nvidia.com/gpu
devices:
  - name: all
    containerEdits:
      env:
        - MODELFORGE_TEST_CDI_GPU=stub
containerEdits: {}
"""


@pytest.fixture
def nvidia_cdi():
    """A CDI spec for `nvidia.com/gpu=all` when the machine has none (it has no GPU).

    podman-compose turns the compose file's NVIDIA device reservation into
    `--device nvidia.com/gpu=all`; the stub lets that resolve to an environment variable
    instead of a device, so the rest of the file is exercised as written.
    """
    existing = [path for directory in ("/etc/cdi", "/var/run/cdi") for path in Path(directory).glob("*")]
    if any("nvidia.com/gpu" in path.read_text(errors="replace") for path in existing if path.is_file()):
        yield False
        return
    stub = Path("/var/run/cdi/modelforge-test-nvidia.yaml")
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text(NVIDIA_CDI_STUB)
    yield True
    stub.unlink(missing_ok=True)


def test_node_agent_compose_file_brings_the_agent_up(agent_image, agent_server, nvidia_cdi, tmp_path):
    compose = str(Path(sys.executable).parent / "podman-compose")  # from the test extra
    volumes = {}
    for variable, name in (("STATE", "state"), ("HF_CACHE", "hf-cache"), ("ARTIFACT", "artifacts"),
                           ("QUARANTINE", "quarantine")):  # fmt: skip
        directory = tmp_path / "appdata" / name
        directory.mkdir(parents=True)
        os.chown(directory, 65532, 65532)  # as the operator guide says: the agent's user owns them
        volumes[f"MODELFORGE_AGENT_{variable}_VOLUME"] = str(directory)
    # The only addition to the file: host networking, so the container reaches the test's
    # loopback control plane (a real node reaches its control plane over the network).
    override = tmp_path / "host-network.yml"
    override.write_text("services:\n  node-agent:\n    network_mode: host\n")
    minted = mint_token(agent_server.url)
    project = f"mftest{os.urandom(3).hex()}"
    env = {
        **os.environ,
        **volumes,
        "MODELFORGE_NODE_AGENT_IMAGE": agent_image,
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": agent_server.url,
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN": minted["token"],
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_HOSTNAME": "compose-node",
    }
    files = ["-f", str(PROJECT_ROOT / "deploy/docker-compose.node-agent.yml"), "-f", str(override), "-p", project]
    up = subprocess.run([compose, *files, "up", "-d"], env=env, capture_output=True, text=True, timeout=300)
    container = f"{project}_node-agent_1"
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        Container(container, "", agent_server.url).wait_for("inventory published")
        settings = podman(
            "inspect", container, "--format",
            "{{.HostConfig.ReadonlyRootfs}}|{{.HostConfig.SecurityOpt}}|{{.HostConfig.RestartPolicy.Name}}|"
            "{{.HostConfig.Privileged}}",
        ).stdout.strip().split("|")  # fmt: skip
        assert settings[0] == "true" and "no-new-privileges" in settings[1]
        assert settings[2] == "unless-stopped" and settings[3] == "false"
        assert (tmp_path / "appdata/state/node-credential").stat().st_mode & 0o777 == 0o600
        node_id = (tmp_path / "appdata/state/node-id").read_text().strip()
        node = requests.get(f"{agent_server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10).json()
        assert node["hostname"] == "compose-node"
        logs = podman("logs", container, check=False)
    finally:
        subprocess.run([compose, *files, "down"], env=env, capture_output=True, timeout=300)
    assert_no_secrets(logs.stdout + logs.stderr, minted["token"])


def test_control_plane_image_migrates_and_serves(agent_image, tmp_path):
    build_control_plane_image()
    port = free_port()
    name = f"mf-control-plane-{os.urandom(3).hex()}"
    volume = f"modelforge-test-instance-{os.urandom(3).hex()}"
    podman(
        "run", "-d", f"--name={name}", "--network=host", f"--volume={volume}:/app/instance",
        f"--env=MODELFORGE_BIND=127.0.0.1:{port}", f"--env=MODELFORGE_OPERATOR_API_KEY={OPERATOR_KEY}",
        CONTROL_PLANE_IMAGE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.5)
        else:
            raise AssertionError(podman("logs", name, check=False).stderr)
        # Migrations ran on start: the API answers from the database in the instance volume.
        nodes = requests.get(url + "/api/v1/hardware/nodes", headers=ADMIN, timeout=5)
        assert nodes.status_code == 200 and nodes.json() == {"nodes": []}
        assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
        files = podman("exec", name, "ls", "/app/instance").stdout.split()
        assert "modelforge.sqlite3" in files and "secret-key" in files
        assert "operator-api-key" not in files  # the key came from the environment
    finally:
        podman("rm", "-f", name, check=False)
        podman("volume", "rm", "-f", volume, check=False)


# --------------------------------------------------------------------------- runtime worker (W1-W3)


@pytest.fixture(scope="session")
def worker_image():
    """The CPU worker image from deploy/Dockerfile.runtime-worker-cpu, production bases swapped."""
    ensure_bases()
    if not image_exists(WORKER_BUILD_BASE):
        with tempfile.TemporaryDirectory(prefix="modelforge-worker-base-") as context:
            (Path(context) / "Containerfile").write_text(WORKER_BUILD_BASE_CONTAINERFILE)
            podman("build", "-t", WORKER_BUILD_BASE, context)
    podman(
        "build", "-f", str(PROJECT_ROOT / "deploy/Dockerfile.runtime-worker-cpu"),
        "--build-arg", f"BUILD_IMAGE={WORKER_BUILD_BASE}", "--build-arg", f"RUNTIME_IMAGE={RUNTIME_BASE}",
        "--build-arg", "REVISION=test", "-t", WORKER_IMAGE, str(PROJECT_ROOT),
        timeout=WORKER_BUILD_TIMEOUT,
    )  # fmt: skip
    return WORKER_IMAGE


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over the worker's Unix socket, as the agent speaks to it (W1)."""

    def __init__(self, path: Path, timeout: float = 30) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def ask(path: Path, method: str, url: str, body: dict | None = None) -> tuple[int, dict]:
    connection = UnixHTTPConnection(path)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        connection.request(method, url, body=payload, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def finished(path: Path, job_id: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, job = ask(path, "GET", f"/v1/jobs/{job_id}")
        assert status == 200, job
        if job["state"] != "running":
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still running after {timeout}s: {job}")


@pytest.fixture
def worker_container(worker_image, tmp_path):
    """The CPU worker, hardened as docker-compose.runtime-worker.yml asks, a tiny model to read."""
    from tests.support.tiny_gguf import write_tiny_llama

    artifacts = tmp_path / "artifacts"
    (artifacts / "models").mkdir(parents=True)
    write_tiny_llama(artifacts / "models" / "tiny.gguf")
    # A short path: a Unix socket's name must fit in 108 bytes. Owned by the images' user (65532),
    # as the compose file's tmpfs volume is.
    socket_dir = Path(tempfile.mkdtemp(prefix="mfw-"))
    os.chown(socket_dir, 65532, 65532)
    socket_dir.chmod(0o770)
    name = f"mf-worker-{os.urandom(3).hex()}"
    podman(
        "run", "-d", f"--name={name}", "--network=none", *HARDENING,
        f"--volume={artifacts}:/data/artifacts:ro", f"--volume={socket_dir}:/run/modelforge", worker_image,
    )  # fmt: skip
    sock = socket_dir / "worker.sock"
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            running = podman("inspect", name, "--format", "{{.State.Running}}", check=False).stdout.strip()
            assert running == "true" and time.monotonic() < deadline, podman("logs", name, check=False).stderr
            time.sleep(0.2)
        yield name, sock
    finally:
        podman("rm", "-f", "-t", "5", name, check=False)
        shutil.rmtree(socket_dir, ignore_errors=True)


def test_hardened_cpu_worker_answers_and_benchmarks_a_model_without_network(worker_container):
    name, sock = worker_container
    # W1, W3: no network but loopback, read-only root, no capabilities, no privilege gain, 65532.
    settings = podman(
        "inspect", name, "--format",
        "{{.HostConfig.NetworkMode}}|{{.HostConfig.ReadonlyRootfs}}|{{.HostConfig.CapDrop}}|{{.HostConfig.SecurityOpt}}",
    ).stdout.strip().split("|")  # fmt: skip
    assert settings[0] == "none" and settings[1] == "true" and "no-new-privileges" in settings[3]
    interfaces = podman("exec", name, "python3", "-c", "import socket; print(socket.if_nameindex())").stdout
    assert "'lo'" in interfaces and "eth" not in interfaces
    assert podman("exec", name, "python3", "-c", "import os; print(os.getuid(), os.getgid())").stdout.split() == [
        "65532", "65532",
    ]  # fmt: skip
    # The agent, running as the same user, can use the socket: 0660, owned by 65532.
    mode = sock.stat()
    assert stat.S_ISSOCK(mode.st_mode) and stat.S_IMODE(mode.st_mode) == 0o660 and mode.st_uid == 65532

    status, info = ask(sock, "GET", "/v1/info")
    assert status == 200, info
    assert info["protocol_version"] == 1 and info["job"] is None and info["devices"] == []
    assert info["engines"] == [{"name": "llama.cpp", "version": "0.3.36", "backend": "cpu"}]

    # W2: a real benchmark of a real (tiny) GGUF model, read from the read-only artifact volume.
    job_id = str(uuid.uuid4())
    params = {"artifact_id": str(uuid.uuid4()), "model_file": "tiny.gguf", "model_path": "models/tiny.gguf",
              "prompt_tokens": 32, "generate_tokens": 8, "repetitions": 2}  # fmt: skip
    status, job = ask(sock, "POST", "/v1/jobs", {"id": job_id, "type": "runtime.benchmark.v1", "params": params})
    assert status == 202, job
    job = finished(sock, job_id)
    assert job["state"] == "succeeded", job
    result = job["result"]
    assert result["engine"]["backend"] == "cpu" and result["gpu_uuids"] == [] and result["n_gpu_layers"] == 0
    assert result["prompt_tokens_per_second"]["mean"] > 0 and len(result["generate_tokens_per_second"]["samples"]) == 2
    assert result["peak_gpu_memory_bytes"] is None and result["peak_rss_bytes"] > 0

    # The smoke test: the model answers, the same text twice (temperature 0, fixed seed).
    texts = []
    for _ in range(2):
        generate_id = str(uuid.uuid4())
        body = {"id": generate_id, "type": "runtime.generate.v1",
                "params": {**params, "prompts": ["Hello"], "max_tokens": 4}}  # fmt: skip
        assert ask(sock, "POST", "/v1/jobs", body)[0] == 202
        job = finished(sock, generate_id)
        assert job["state"] == "succeeded", job
        texts.append(job["result"]["outputs"][0]["text"])
    assert texts[0] == texts[1]

    # A path out of the artifact directory is refused before anything is loaded (W1).
    escape = {"id": str(uuid.uuid4()), "type": "runtime.benchmark.v1", "params": {**params, "model_path": "../x"}}
    status, refused = ask(sock, "POST", "/v1/jobs", escape)
    assert status == 422 and refused["error"]["code"] == "MODEL_FILE_INVALID"

    # Nothing written outside the socket volume and the tmpfs.
    changes = set(podman("diff", name).stdout.split("\n")) - {""}
    assert changes <= PODMAN_MANAGED, changes - PODMAN_MANAGED


def test_a_real_agent_advertises_runtime_jobs_while_the_worker_answers(worker_container, agent_server, tmp_path):
    """W1: the agent on the host finds the containerised worker on the shared socket.

    (That the agent stops advertising them when the worker goes is the agent's own test: it asks
    again only at its next inventory check, a minute later.)
    """
    name, sock = worker_container
    minted = mint_token(agent_server.url)
    agent = AgentProcess(
        tmp_path, agent_server.url, MODELFORGE_AGENT_ENROLLMENT_TOKEN=minted["token"],
        MODELFORGE_AGENT_WORKER_SOCKET=str(sock),
    ).start()  # fmt: skip
    try:
        agent.wait_for("inventory published")
        node_id = agent.node_id()
        deadline = time.monotonic() + 30
        node = {}
        while time.monotonic() < deadline:
            node = requests.get(f"{agent_server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10).json()
            if "runtime.benchmark.v1" in (node.get("capabilities") or []):
                break
            time.sleep(0.5)
        assert {"runtime.benchmark.v1", "runtime.generate.v1"} <= set(node["capabilities"]), node
        assert "artifact.acquire.v1" in node["capabilities"]

    finally:
        agent.stop()
    assert_no_secrets(agent.log(), minted["token"])


def test_worker_compose_overlays_bring_up_agent_and_cpu_worker_sharing_the_socket(
    agent_image, worker_image, agent_server, tmp_path
):
    """W3: the three files as the operator guide runs them on a node without a GPU, for real."""
    from tests.support.tiny_gguf import write_tiny_llama

    compose = str(Path(sys.executable).parent / "podman-compose")
    volumes = {}
    for variable, name in (("STATE", "state"), ("HF_CACHE", "hf-cache"), ("ARTIFACT", "artifacts"),
                           ("QUARANTINE", "quarantine")):  # fmt: skip
        directory = tmp_path / "appdata" / name
        directory.mkdir(parents=True)
        os.chown(directory, 65532, 65532)
        volumes[f"MODELFORGE_AGENT_{variable}_VOLUME"] = str(directory)
    write_tiny_llama(tmp_path / "appdata" / "artifacts" / "tiny.gguf")
    override = tmp_path / "host-network.yml"  # as above: the agent reaches the test's loopback server
    override.write_text("services:\n  node-agent:\n    network_mode: host\n")
    minted = mint_token(agent_server.url)
    project = f"mftest{os.urandom(3).hex()}"
    env = {
        **os.environ,
        **volumes,
        "MODELFORGE_NODE_AGENT_IMAGE": agent_image,
        "MODELFORGE_RUNTIME_WORKER_CPU_IMAGE": worker_image,
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": agent_server.url,
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN": minted["token"],
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_HOSTNAME": "worker-node",
    }
    files = []
    for name in ("docker-compose.node-agent.yml", "docker-compose.runtime-worker.yml",
                 "docker-compose.runtime-worker.cpu.yml"):  # fmt: skip
        files += ["-f", str(PROJECT_ROOT / "deploy" / name)]
    files += ["-f", str(override), "-p", project]
    up = subprocess.run([compose, *files, "up", "-d"], env=env, capture_output=True, text=True, timeout=600)
    agent, worker = f"{project}_node-agent_1", f"{project}_runtime-worker_1"
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        Container(agent, "", agent_server.url).wait_for("inventory published")
        settings = podman(
            "inspect", worker, "--format",
            "{{.HostConfig.NetworkMode}}|{{.HostConfig.ReadonlyRootfs}}|{{.HostConfig.SecurityOpt}}|"
            "{{.HostConfig.RestartPolicy.Name}}|{{.HostConfig.Privileged}}",
        ).stdout.strip().split("|")  # fmt: skip
        assert settings[0] == "none" and settings[1] == "true" and "no-new-privileges" in settings[2]
        assert settings[3] == "unless-stopped" and settings[4] == "false"
        # One socket, seen by both: the worker made it, the agent (another container) can open it.
        probe = (
            "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/modelforge/worker.sock');"
            "s.sendall(b'GET /v1/info HTTP/1.1\\r\\nHost: w\\r\\nConnection: close\\r\\n\\r\\n');"
            "print(s.recv(65536).decode())"
        )
        deadline = time.monotonic() + 60
        answer = ""
        while not re.search(r'"protocol_version":\s*1\b', answer) and time.monotonic() < deadline:
            answer = podman("exec", agent, "python3", "-c", probe, check=False).stdout
            time.sleep(0.5)
        assert re.search(r'"protocol_version":\s*1\b', answer) and re.search(r'"backend":\s*"cpu"', answer), answer
        # The artifacts the agent writes, the worker reads, read-only.
        listing = podman("exec", worker, "python3", "-c", "import os; print(os.listdir('/data/artifacts'))")
        assert "tiny.gguf" in listing.stdout
        refused = podman("exec", worker, "python3", "-c", "open('/data/artifacts/x', 'w')", check=False)
        assert "Read-only file system" in refused.stderr
        node_id = (tmp_path / "appdata/state/node-id").read_text().strip()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            node = requests.get(f"{agent_server.url}/api/v1/hardware/nodes/{node_id}", headers=ADMIN, timeout=10).json()
            if "runtime.generate.v1" in node["capabilities"]:
                break
            time.sleep(0.5)
        assert {"runtime.benchmark.v1", "runtime.generate.v1"} <= set(node["capabilities"]), node
        logs = podman("logs", agent, check=False)
    finally:
        subprocess.run([compose, *files, "down", "-v"], env=env, capture_output=True, timeout=300)
    assert_no_secrets(logs.stdout + logs.stderr, minted["token"])
