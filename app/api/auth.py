"""Who may call the API: the operator key (admin) or a node credential (agent)."""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import wraps

import sqlalchemy as sa
from flask import request

from app import tokens
from app.api.errors import ApiError
from app.config import current_settings
from app.errors import DomainError
from app.extensions import db
from app.models import Gpu, Node
from app.nodes import publishing
from app.timeutil import utcnow

logger = logging.getLogger("modelforge.auth")

ADMIN_HEADER = "X-ModelForge-Admin-Token"
# The OpenAPI security schemes these checks are (app/api/openapi.py describes each).
ADMIN_SCHEME = "adminToken"
NODE_SCHEME = "nodeCredential"


def admin_required(view):
    """Refuse the request unless it carries the operator key (constant-time compare)."""

    @wraps(view)
    def wrapper(*args, **kwargs):
        presented = request.headers.get(ADMIN_HEADER)
        if not presented:
            raise ApiError(
                401,
                "ADMIN_TOKEN_REQUIRED",
                f"This endpoint needs the {ADMIN_HEADER} header.",
                "Send the operator API key (instance/operator-api-key or MODELFORGE_OPERATOR_API_KEY) in that header.",
            )
        expected = current_settings().operator_api_key
        if not tokens.same_secret(expected, presented):
            raise ApiError(
                401,
                "ADMIN_TOKEN_INVALID",
                f"The {ADMIN_HEADER} header does not hold the operator API key.",
                "Copy the key again from instance/operator-api-key or MODELFORGE_OPERATOR_API_KEY.",
            )
        return view(*args, **kwargs)

    wrapper.security_schemes = (ADMIN_SCHEME,)  # the document's security follows the check (operations.route)
    return wrapper


def bearer_credential() -> str:
    """The node credential from `Authorization: Bearer …`, or a 401."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise ApiError(
            401,
            "CREDENTIAL_REQUIRED",
            "Agent endpoints need the node credential as `Authorization: Bearer mfn_…`.",
            "Enrol the node first; the agent stores its credential in <state>/node-credential.",
        )
    return secret


# After a restore from a backup older than a node's re-enrolment or rotation, its agent presents a
# credential the database never saw: 401 CREDENTIAL_INVALID, and the agent exits 5 and stays down.
# The secret names no node, so the GPU UUIDs the same request reports do: the nodes they belong to
# get `credential_refused_at` (the console's hint), at most once a minute each, and never the secret.
REFUSAL_NOTE_SPACING = timedelta(minutes=1)
_MAX_UUIDS_CONSIDERED = 16
_MAX_NODES_NOTED = 4
_gpus = Gpu.__table__
_nodes = Node.__table__
_NODES_OF_GPUS = (
    sa.select(_nodes.c.id, _nodes.c.credential_refused_at)
    .select_from(_gpus.join(_nodes, _nodes.c.id == _gpus.c.node_id))
    .where(_gpus.c.uuid.in_(sa.bindparam("uuids", expanding=True)))
    .distinct()
    .limit(_MAX_NODES_NOTED)
)
_NOTE_REFUSAL = (
    _nodes.update()
    .where(
        _nodes.c.id.in_(sa.bindparam("node_ids", expanding=True)),
        sa.or_(_nodes.c.credential_refused_at.is_(None), _nodes.c.credential_refused_at <= sa.bindparam("due")),
    )
    .values(credential_refused_at=sa.bindparam("now"))
)


def reported_gpu_uuids(body: object) -> set[str]:
    """The GPU UUIDs an agent body names: an inventory's GPUs, a heartbeat's telemetry."""
    inventory = getattr(body, "inventory", None)
    uuids = [gpu.uuid for gpu in getattr(inventory, "gpus", None) or ()]
    uuids += [sample.gpu_uuid for sample in getattr(body, "telemetry", None) or ()]
    return set(uuids[:_MAX_UUIDS_CONSIDERED])


def note_refused_credential(gpu_uuids: set[str]) -> list[str]:
    """Record, on the nodes these GPUs belong to, that an unknown credential came with them.

    Rate-bounded: a node noted within REFUSAL_NOTE_SPACING is not written again (it is read
    first, so a flood of refused requests writes once a minute per node, whatever it sends).
    Returns the nodes written now. The request is refused either way; this never changes that.
    """
    db.session.rollback()  # whatever the refused lookup began
    if not gpu_uuids:
        return []
    now = utcnow()
    due = now - REFUSAL_NOTE_SPACING
    try:
        found = db.session.connection().execute(_NODES_OF_GPUS, {"uuids": sorted(gpu_uuids)}).all()
        node_ids = [row.id for row in found if row.credential_refused_at is None or row.credential_refused_at <= due]
        if node_ids:
            db.session.connection().execute(_NOTE_REFUSAL, {"node_ids": node_ids, "due": due, "now": now})
        db.session.commit()
    except sa.exc.SQLAlchemyError:
        db.session.rollback()
        logger.warning("could not record a refused node credential", exc_info=True)
        return []
    for node_id in node_ids:
        logger.warning(
            "node %s: its agent presented a node credential this control plane does not know (401); "
            "after a restore from a backup, rotate its credential or re-enrol it (node page)",
            node_id,
        )
    return node_ids


def authenticate_publisher(body: object) -> publishing.Publisher:
    """The node behind the request's bearer credential (publishing.authenticate: an indexed hash
    lookup, then a constant-time compare); an unknown one is noted on the node its GPUs name."""
    try:
        return publishing.authenticate(bearer_credential())
    except DomainError as error:
        if error.code == "CREDENTIAL_INVALID":
            note_refused_credential(reported_gpu_uuids(body))
        raise
