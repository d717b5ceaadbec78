"""Who may call the API: the operator key (admin) or a node credential (agent)."""

from __future__ import annotations

from functools import wraps

from flask import request

from app import tokens
from app.api.errors import ApiError
from app.config import current_settings

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
