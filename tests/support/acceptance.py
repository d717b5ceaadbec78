"""Acceptance evidence (V1) through the Flask test client: an agent's inventory, a smoke test, a
hardened container's inspect, a real PNG."""

from __future__ import annotations

import json
import struct
import zlib

from tests.support import EVERY_TYPE, GENERATE, factories
from tests.support.nodes import agent
from tests.support.runtime import acquired_artifact, create, generate_result, worker

ENV_SECRET = "hf_" + "S3cretValueFromTheEnv" * 2


GPU_UUID = "GPU-00000000-0000-0000-0000-000000000001"

# What nvidia-smi prints for tests/factories.gpu() (17_171_480_576 bytes = 16376 MiB).
SMI_OUTPUT = f"NVIDIA GeForce RTX 4080, {GPU_UUID}, 550.54.14, 16376 MiB\n"


def png(width: int = 4, height: int = 3, rgb: tuple[int, int, int] = (36, 88, 214)) -> bytes:
    """A real PNG: signature, IHDR, one zlib-compressed IDAT of RGB rows, IEND, each chunk CRC'd."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


# The JPEG standard's luminance Huffman tables (ITU T.81 Annex K.3): code lengths, and the DC
# categories. The AC table's symbols are EOB, ZRL and every (run, size) pair; only their count and
# the first four (whose codes are 00, 01, 100 and EOB's 1010) matter to what jpeg() writes.
_DC_LENGTHS = bytes([0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
_AC_LENGTHS = bytes([0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 0x7D])
_AC_FIRST = [0x01, 0x02, 0x03, 0x00]
_AC_SYMBOLS = bytes(
    _AC_FIRST + sorted({0xF0, *(run << 4 | size for run in range(16) for size in range(1, 11))} - set(_AC_FIRST))
)


def jpeg(width: int = 640, height: int = 480) -> bytes:
    """A real baseline JPEG any decoder reads: mid-grey, one component, every 8×8 block DC 0 then EOB.

    With the standard tables a block is the DC category 0 code (00) and EOB (1010): six bits.
    """

    def segment(marker: int, body: bytes) -> bytes:
        return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body

    blocks = -(-width // 8) * -(-height // 8)
    bits = "001010" * blocks
    bits += "1" * (-len(bits) % 8)  # padded with ones, as T.81 F.1.2.3 says
    scan = int(bits, 2).to_bytes(len(bits) // 8, "big")  # the pattern never makes a 0xFF byte to stuff
    dc_table = segment(0xC4, b"\x00" + _DC_LENGTHS + bytes(range(12)))
    ac_table = segment(0xC4, b"\x10" + _AC_LENGTHS + _AC_SYMBOLS)
    return (
        b"\xff\xd8"
        + segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
        + segment(0xDB, b"\x00" + bytes([1] * 64))
        + segment(0xC0, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
        + dc_table
        + ac_table
        + segment(0xDA, b"\x01\x01\x00\x00\x3f\x00")
        + scan
        + b"\xff\xd9"
    )


def inspect_text(hardened: bool = True) -> str:
    """`docker inspect` of the node-agent container, as an admin pastes it; its Env holds a secret value."""
    host = {
        "RestartPolicy": {"Name": "unless-stopped", "MaximumRetryCount": 0},
        "ReadonlyRootfs": True,
        "Privileged": False,
        "CapAdd": None,
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges:true"],
        "NetworkMode": "bridge",
        "PortBindings": {},
        "Binds": ["/mnt/user/appdata/modelforge/state:/data/state:rw"],
    }
    if not hardened:
        host |= {
            "ReadonlyRootfs": False,
            "CapDrop": None,
            "SecurityOpt": None,
            "PortBindings": {"8080/tcp": [{"HostIp": "", "HostPort": "8080"}]},
            "Binds": ["/var/run/docker.sock:/var/run/docker.sock"],
        }
    document = {
        "Id": "f" * 64,
        "Name": "/deploy-node-agent-1",
        "Image": "sha256:" + "a" * 64,
        "RestartCount": 0,
        "State": {"Status": "running", "Running": True, "StartedAt": "2026-12-01T00:00:00Z"},
        "HostConfig": host,
        "Config": {
            "Image": "modelforge-node-agent:local",
            "Env": ["MODELFORGE_AGENT_API_URL=http://control-plane:8000", f"HF_TOKEN={ENV_SECRET}"],
            "Labels": {"com.docker.compose.service": "node-agent"},
        },
        "Mounts": [],
        "NetworkSettings": {"Ports": {}},
    }
    return json.dumps([document], indent=4)


def publish(client, node, start_id: str, smi_output: str = SMI_OUTPUT) -> None:
    """An inventory as this control plane's agent sends it: its start id and nvidia-smi's output."""
    body = {
        **factories.inventory_body(agent=agent_facts(start_id), nvidia_smi={"output": smi_output, "exit_status": 0}),
        "capabilities": EVERY_TYPE,
        "runtime_worker": worker(),
    }
    response = client.post("/api/v1/agent/inventory", json=body, headers=node["auth"])
    assert response.status_code == 200, response.get_json()


def smoke_test(client, node) -> None:
    """W2: a runtime.generate.v1 job claimed and completed by the node's agent."""
    artifact = acquired_artifact(client, node)
    params = {"artifact_id": artifact["id"], "model_file": "tiny.gguf", "prompts": ["Hello"], "max_tokens": 16}
    job = create(client, GENERATE, node["id"], params).get_json()
    assert agent(client, node, "jobs/claim", capabilities=EVERY_TYPE).get_json()["job"]["id"] == job["id"]
    response = agent(client, node, f"jobs/{job['id']}/complete", attempt=1, result=generate_result(artifact["id"]))
    assert response.status_code == 200, response.get_json()


def agent_facts(start_id: str) -> dict[str, object]:
    return {"version": factories.AGENT_VERSION, "python": "3.11.2", "start_id": start_id}
