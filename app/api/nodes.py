"""Admin API for nodes: read back, rotate/revoke credentials, disable/enable (I5, I6), drain (S3)."""

from __future__ import annotations

from app import nodes
from app.api import bodies, json_response, operations, replies
from app.api.auth import admin_required
from app.api.validation import json_object
from app.config import current_settings
from app.nodes import readiness


@operations.get("/hardware/nodes", "All nodes", replies={200: (replies.Nodes, "Nodes")}, errors=(401,))
@admin_required
def list_nodes():
    """Every node with status, inventory, GPUs, latest telemetry and credential metadata."""
    return json_response({"nodes": nodes.describe(None, current_settings())})


@operations.get("/hardware/nodes/<node_id>", "One node", replies={200: (replies.Node, "The node")}, errors=(401, 404))
@admin_required
def get_node(node_id: str):
    """One node in the wire format."""
    described = nodes.describe([node_id], current_settings())
    if not described:
        nodes.get(node_id)  # raises NODE_NOT_FOUND
    return json_response(described[0])


@operations.post(
    "/admin/nodes/<node_id>/credential/rotate",
    "Issue a new credential once and invalidate the old one (I5)",
    replies={201: (replies.IssuedCredential, "The new credential, shown once")},
    errors=(401, 404),
)
@admin_required
def rotate_credential(node_id: str):
    """Issue a new credential (shown once) and invalidate the old one."""
    credential, secret = nodes.rotate_credential(node_id)
    return json_response({"credential": secret, "node_id": node_id, **credential.to_dict()}, 201)


@operations.post(
    "/admin/nodes/<node_id>/credential/revoke",
    "Revoke the active credential (I5)",
    replies={200: (replies.RevokedCredential, "Revoked")},
    errors=(401, 404, 409),
)
@admin_required
def revoke_credential(node_id: str):
    """Leave the node with no active credential."""
    credential = nodes.revoke_credential(node_id)
    return json_response({"node_id": node_id, **credential.to_dict()})


@operations.post(
    "/admin/nodes/<node_id>/disable",
    "Disable the node (I6)",
    replies={200: (replies.Node, "Disabled")},
    errors=(401, 404),
)
@admin_required
def disable_node(node_id: str):
    """Make the node ineligible and refuse its publications at once."""
    nodes.set_disabled(node_id, True)
    return json_response(nodes.describe([node_id], current_settings())[0])


@operations.post(
    "/admin/nodes/<node_id>/enable",
    "Enable the node (I6)",
    replies={200: (replies.Node, "Enabled")},
    errors=(401, 404),
)
@admin_required
def enable_node(node_id: str):
    """Undo disable."""
    nodes.set_disabled(node_id, False)
    return json_response(nodes.describe([node_id], current_settings())[0])


@operations.post(
    "/admin/nodes/<node_id>/drain",
    "Drain the node: it finishes what runs and takes no new job or deployment (S3)",
    replies={200: (replies.Node, "Draining")},
    errors=(401, 404),
)
@admin_required
def drain_node(node_id: str):
    """Before maintenance: its running job finishes, queued jobs wait, deployments keep serving."""
    nodes.set_draining(node_id, True)
    return json_response(nodes.describe([node_id], current_settings())[0])


@operations.post(
    "/admin/nodes/<node_id>/undrain",
    "Undrain the node (S3)",
    replies={200: (replies.Node, "Taking work again")},
    errors=(401, 404),
)
@admin_required
def undrain_node(node_id: str):
    """Undo drain: queued jobs are claimed again."""
    nodes.set_draining(node_id, False)
    return json_response(nodes.describe([node_id], current_settings())[0])


@operations.post(
    "/admin/nodes/<node_id>/eligibility",
    "Set lab_eligible and benchmark_eligible: where placement may put lab deployments and benchmarks (S3)",
    description="Scheduler metadata only: nothing starts. production_eligible is set through "
    "POST /api/v1/admin/nodes/{id}/production-eligibility, which checks the acceptance evidence (V1).",
    body=bodies.NodeEligibility,
    replies={200: (replies.Node, "The node with its flags")},
    errors=(400, 401, 404, 413, 415),
)
@admin_required
def set_node_eligibility(node_id: str):
    """S3: the flags given are set; those left out keep their value."""
    body = bodies.parse(bodies.NodeEligibility, json_object())
    nodes.set_eligibility(node_id, body.model_dump(exclude_none=True))
    return json_response(nodes.describe([node_id], current_settings())[0])


@operations.get(
    "/admin/nodes/<node_id>/readiness",
    "Is this exact node ready, check by check (R1, R2)",
    replies={200: (replies.Readiness, "Readiness")},
    errors=(401, 404),
)
@admin_required
def node_readiness(node_id: str):
    """R2: is this exact node ready, check by check."""
    result = readiness.for_node(node_id, current_settings())
    if result is None:
        nodes.get(node_id)  # raises NODE_NOT_FOUND
    return json_response(result)
