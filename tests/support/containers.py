"""podman: the test base images (debootstrap, made once and kept), image builds and a thin runner."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support import PROJECT_ROOT

RUNTIME_BASE = "localhost/modelforge-test-runtime-base:bookworm"


BUILD_BASE = "localhost/modelforge-test-build-base:bookworm-pip-venv"

CONTROL_PLANE_IMAGE = "localhost/modelforge-control-plane:test"

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check, timeout=timeout)


def ensure_bases() -> None:
    missing = [tool for tool in ("podman", "debootstrap", "runc") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no container engine here ({', '.join(missing)} missing)")
    if not (image_exists(RUNTIME_BASE) and image_exists(BUILD_BASE)):
        make_bases()


def build_control_plane_image() -> str:
    """The control-plane image from deploy/Dockerfile.control-plane on the build base (D1)."""
    ensure_bases()
    podman(
        "build", "-f", str(PROJECT_ROOT / "deploy/Dockerfile.control-plane"),
        "--build-arg", f"BASE_IMAGE={BUILD_BASE}", "-t", CONTROL_PLANE_IMAGE, str(PROJECT_ROOT),
    )  # fmt: skip
    return CONTROL_PLANE_IMAGE


def image_exists(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


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


def import_rootfs(rootfs: Path, name: str) -> None:
    with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
        subprocess.run(["podman", "import", "-", name], stdin=tar.stdout, capture_output=True, check=True, timeout=600)
