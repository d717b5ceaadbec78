"""Admin API for deployments (S2): create, list, read, stop."""

from __future__ import annotations

from flask import request

from app.api import bodies, json_response, operations, replies
from app.api.auth import admin_required
from app.api.validation import json_object
from app.serving import deployments


@operations.post(
    "/admin/deployments",
    "Deploy a model file of an acquired artifact under a name clients use as `model` (S2)",
    description="Created `pending` on the node placement chose (S3: may receive work, eligible for the tier, a "
    "compatible worker, holds the model, fits by the GGUF header's estimate; a named node is judged the same), "
    "else 409 NO_NODE_FITS listing every node and why; the node learns of it in its next heartbeat reply and reports "
    "`loading`, then `ready` or `failed`. A name is taken while a deployment that is not stopped holds it "
    "(409 DEPLOYMENT_NAME_TAKEN).",
    body=bodies.DeploymentCreate,
    replies={201: (replies.Deployment, "Created, pending")},
    errors=(400, 401, 404, 409, 413, 415),
)
@admin_required
def create_deployment():
    """S2: a new deployment, pending on the node chosen for it."""
    body = bodies.parse(bodies.DeploymentCreate, json_object())
    created = deployments.create(deployments.Request(**body.model_dump()))
    return json_response(created.to_dict(), 201)


@operations.get(
    "/admin/deployments",
    "Deployments newest first, stopped ones too; optionally one node's (S2)",
    query={"node_id": operations.TEXT},
    replies={200: (replies.Deployments, "Deployments")},
    errors=(400, 401),
)
@admin_required
def list_deployments():
    """S2: every deployment, newest first."""
    found = deployments.list_all(request.args.get("node_id"))
    return json_response({"deployments": [deployment.to_dict() for deployment in found]})


@operations.get(
    "/admin/deployments/<deployment_id>",
    "One deployment (S2)",
    replies={200: (replies.Deployment, "The deployment")},
    errors=(401, 404),
)
@admin_required
def get_deployment(deployment_id: str):
    """S2: one deployment, with what the node measured and any error."""
    return json_response(deployments.get(deployment_id).to_dict())


@operations.delete(
    "/admin/deployments/<deployment_id>",
    "Stop a deployment: `stopping` until the node confirms `stopped` (S2)",
    replies={
        202: (replies.Deployment, "Stopping (asked now, or already); the node confirms with `stopped`"),
        200: (replies.Deployment, "Already stopped: nothing changes"),
    },
    errors=(401, 404),
)
@admin_required
def delete_deployment(deployment_id: str):
    """S2: ask the node to stop it; deleting it again answers its current state, unchanged."""
    deployment = deployments.delete(deployment_id)
    return json_response(deployment.to_dict(), 200 if deployment.state == "stopped" else 202)


@operations.post(
    "/admin/deployments/<deployment_id>/move",
    "Serve a deployment from another node, e.g. off a draining one (S3)",
    description="Placed by the same rules as a new deployment on any node but its own (or on `node_id`), "
    "`pending` there; its old node stops it. 409 NO_NODE_FITS names each node and why; 409 "
    "DEPLOYMENT_NOT_MOVABLE when it is stopping or stopped.",
    body=bodies.DeploymentMove,
    replies={200: (replies.Deployment, "Moved: pending on its new node")},
    errors=(400, 401, 404, 409, 413, 415),
)
@admin_required
def move_deployment(deployment_id: str):
    """S3: the deployment, pending on the node it moved to."""
    body = bodies.parse(bodies.DeploymentMove, json_object())
    return json_response(deployments.move(deployment_id, body.node_id).to_dict())
