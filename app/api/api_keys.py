"""Admin API for client API keys (S1)."""

from __future__ import annotations

from app.api import bodies, json_response, operations, replies
from app.api.auth import admin_required
from app.api.validation import json_object
from app.serving import api_keys

# S1: what the minting reply says beside the key (the list adds last use and revocation).
_MINTED_FIELDS = ("id", "name", "created_at", "expires_at")


@operations.post(
    "/admin/api-keys",
    "Mint a client API key (S1)",
    body=bodies.ApiKeyCreate,
    replies={201: (replies.MintedApiKey, "Created; `key` appears here only")},
    errors=(400, 401, 413, 415),
)
@admin_required
def create_api_key():
    """Mint a client key; the key appears in this response only (P2)."""
    body = bodies.parse(bodies.ApiKeyCreate, json_object())
    minted, secret = api_keys.mint(body.name, body.expires_in_seconds)
    described = minted.to_dict()
    return json_response({**{field: described[field] for field in _MINTED_FIELDS}, "key": secret}, 201)


@operations.get(
    "/admin/api-keys",
    "List client API keys, newest first, without the keys",
    replies={200: (replies.ApiKeys, "API keys")},
    errors=(401,),
)
@admin_required
def list_api_keys():
    """Every client key's metadata: prefix, creation, last use, expiry, revocation."""
    return json_response({"api_keys": [key.to_dict() for key in api_keys.list_all()]})


@operations.delete(
    "/admin/api-keys/<api_key_id>",
    "Revoke a client API key; its next request is refused (S1)",
    replies={200: (replies.ApiKey, "Revoked (again, if it already was: nothing changes)")},
    errors=(401, 404),
)
@admin_required
def revoke_api_key(api_key_id: str):
    """Revoke a client key; revoking a revoked key answers the same key, unchanged."""
    return json_response(api_keys.revoke(api_key_id).to_dict())
