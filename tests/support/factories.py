"""Small factories for request bodies and enrolled nodes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from tests.support import ADMIN

AGENT_VERSION = "0.1.0-test"


def versions(protocol_version: object = 1) -> dict[str, object]:
    """The version fields every agent request carries."""
    return {"protocol_version": protocol_version, "agent_version": AGENT_VERSION}


def enrollment_body(**overrides: object) -> dict[str, object]:
    """A valid body for POST /api/v1/admin/node-enrollments."""
    return {"display_name": "GPU Node", "expires_in_seconds": 900, **overrides}


def enroll_body(token: str, origin: str = "http://localhost", **overrides: object) -> dict[str, object]:
    """A valid body for POST /api/v1/agent/enroll."""
    return {
        "enrollment_token": token,
        "node_id": str(uuid.uuid4()),
        "hostname": "gpu-node-1",
        "control_plane_url": origin,
        **versions(),
        **overrides,
    }


def gpu(uuid_: str = "GPU-00000000-0000-0000-0000-000000000001", **overrides: object) -> dict[str, object]:
    """One GPU as the agent reports it."""
    return {
        "uuid": uuid_,
        "name": "NVIDIA GeForce RTX 4080",
        "memory_total_bytes": 17_171_480_576,
        "driver_version": "550.54.14",
        "cuda_driver_version": "12.4",
        "pci_bus_id": "00000000:01:00.0",
        **overrides,
    }


def inventory_body(gpus: list[dict[str, object]] | None = None, **facts: object) -> dict[str, object]:
    """A valid body for POST /api/v1/agent/inventory."""
    return {
        **versions(),
        "inventory": {
            "hostname": "gpu-node-1",
            "os": "Debian GNU/Linux 12",
            "kernel": "6.1.0",
            "cpu_model": "AMD Ryzen 9 7950X",
            "cpu_count": 16,
            "memory_total_bytes": 64 * 2**30,
            "gpus": [gpu()] if gpus is None else gpus,
            **facts,
        },
    }


def sample(gpu_uuid: str = "GPU-00000000-0000-0000-0000-000000000001", **overrides: object) -> dict[str, object]:
    """One telemetry sample; metrics NVML cannot read would be null."""
    return {
        "gpu_uuid": gpu_uuid,
        "sampled_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "utilization_gpu_percent": 37.0,
        "memory_used_bytes": 2_000_000_000,
        "temperature_c": 51.0,
        "power_w": 123.4,
        **overrides,
    }


def heartbeat_body(telemetry: list[dict[str, object]] | None = None, **overrides: object) -> dict[str, object]:
    """A valid body for POST /api/v1/agent/heartbeat."""
    return {
        **versions(),
        "health": {"status": "ok", "detail": "all checks passed"},
        "telemetry": [sample()] if telemetry is None else telemetry,
        **overrides,
    }


def bearer(credential: str) -> dict[str, str]:
    """The Authorization header for a node credential."""
    return {"Authorization": f"Bearer {credential}"}


def mint(client, **overrides: object) -> dict[str, object]:
    """Mint an enrolment through the admin API; returns the 201 body (with the token)."""
    response = client.post("/api/v1/admin/node-enrollments", json=enrollment_body(**overrides), headers=ADMIN)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def enrolled_node(client, eligibility: dict[str, bool] | None = None, **overrides: object) -> dict[str, object]:
    """Mint (with these eligibility flags) and claim; returns the enrol 201 body plus the token used."""
    token = mint(client, **(eligibility or {}))["token"]
    response = client.post("/api/v1/agent/enroll", json=enroll_body(token, **overrides))
    assert response.status_code == 201, response.get_json()
    return {**response.get_json(), "token": token}


def expire_enrollments(app, enrollment_id: str | None = None, seconds_ago: int = 1) -> None:
    """Move an enrolment's (or every enrolment's) expiry into the past, straight in the database."""
    import sqlalchemy as sa

    from app.extensions import db
    from app.models import Enrollment
    from app.timeutil import utcnow

    statement = sa.update(Enrollment).values(expires_at=utcnow() - timedelta(seconds=seconds_ago))
    if enrollment_id is not None:
        statement = statement.where(Enrollment.id == enrollment_id)
    with app.app_context():
        db.session.execute(statement)
        db.session.commit()
