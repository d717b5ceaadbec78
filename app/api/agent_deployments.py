"""Agent API for deployments (S2): the node reports what became of each deployment it was given."""

from __future__ import annotations

from app.api import bodies, json_response, operations, replies
from app.api.agent import agent_request
from app.api.auth import NODE_SCHEME
from app.serving import deployments


@operations.post(
    "/agent/deployments/<deployment_id>/status",
    "Report a deployment's state on the node: loading, ready, failed or stopped (S2)",
    description="Only the deployment's own node may report on it; for any other node it is not found (404), "
    "as an unknown id. A stopping deployment stays stopping until the node reports `stopped`; a stopped one "
    "never changes. The same report twice changes nothing and is audited once.",
    security=(NODE_SCHEME,),
    body=bodies.DeploymentStatusRequest,
    replies={200: (replies.DeploymentStatus, "The deployment's state as the control plane now has it")},
    errors=(400, 401, 403, 404, 413, 415, 426),
)
def deployment_status(deployment_id: str):
    """S2: apply the node's report; the reply is the control plane's resulting state."""
    _, _, body, publisher = agent_request(bodies.DeploymentStatusRequest)
    sent = deployments.Report(
        state=body.state,
        error_code=body.error.code if body.error else None,
        error_message=body.error.message if body.error else None,
        measured=body.measured.model_dump() if body.measured else None,
    )
    deployment = deployments.report(publisher.node_id, deployment_id, sent)
    return json_response({"id": deployment.id, "state": deployment.state})
