"""The node-agent image, built and run for real with podman (D2, D4, I1–I3, P1).

No image registry can be reached here, so the production bases are swapped through the
Dockerfile's build arguments for a Debian bookworm base this test makes with debootstrap
(minbase, python3, ca-certificates) and `podman import`. The build stage's base also gets pip
and this machine's CA bundle, because PyPI is reached through the same TLS proxy as on the host.
Both bases are kept by podman between runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from tests.agent_support import mint_token
from tests.support import ADMIN, OPERATOR_KEY, PROJECT_ROOT, assert_no_secrets, free_port

pytestmark = pytest.mark.e2e

RUNTIME_BASE = "localhost/modelforge-test-runtime-base:bookworm"
BUILD_BASE = "localhost/modelforge-test-build-base:bookworm-pip-venv"
AGENT_IMAGE = "localhost/modelforge-node-agent:test"
CONTROL_PLANE_IMAGE = "localhost/modelforge-control-plane:test"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PODMAN_MANAGED = {"C /etc", "A /etc/hosts", "A /etc/hostname", "A /etc/resolv.conf", "C /run", "A /run/.containerenv"}
HARDENING = [
    "--read-only",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
    "--tmpfs=/tmp:size=16m,mode=1777",
]


def podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check, timeout=timeout)


def image_exists(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


def import_rootfs(rootfs: Path, name: str) -> None:
    with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
        subprocess.run(["podman", "import", "-", name], stdin=tar.stdout, capture_output=True, check=True, timeout=600)


def make_bases() -> None:
    """debootstrap a minimal bookworm with python3 once; derive the build base (pip, venv) from it."""
    with tempfile.TemporaryDirectory(prefix="modelforge-rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=python3,ca-certificates", "bookworm", str(rootfs)],
            capture_output=True,
            check=True,
            timeout=900,
        )
        import_rootfs(rootfs, RUNTIME_BASE)
        subprocess.run(
            [
                "chroot",
                str(rootfs),
                "/bin/sh",
                "-c",
                "apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-pip python3-venv",
            ],
            capture_output=True,
            check=True,
            timeout=900,
        )
        shutil.copyfile(HOST_CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
        import_rootfs(rootfs, BUILD_BASE)


@pytest.fixture(scope="session")
def agent_image():
    """The agent image from deploy/Dockerfile.node-agent, production bases swapped."""
    missing = [tool for tool in ("podman", "debootstrap", "runc") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no container engine here ({', '.join(missing)} missing)")
    if not (image_exists(RUNTIME_BASE) and image_exists(BUILD_BASE)):
        make_bases()
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
        assert node["capabilities"] == ["artifact.acquire.v1"]
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
    podman(
        "build", "-f", str(PROJECT_ROOT / "deploy/Dockerfile.control-plane"),
        "--build-arg", f"BASE_IMAGE={BUILD_BASE}", "-t", CONTROL_PLANE_IMAGE, str(PROJECT_ROOT),
    )  # fmt: skip
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
