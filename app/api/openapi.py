"""The OpenAPI 3.1 description of the API, served at GET /api/v1/openapi.json.

Assembled, not written: each view declares its operation beside its route (app/api/operations.py),
request bodies are the models of app/api/bodies.py and replies those of app/api/replies.py. A test
compares the paths and methods with Flask's registered routes, and schemathesis checks every
response against the document, so the document and the code cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from app import rules
from app.api import import_views, json_response, operations, replies
from app.api.auth import ADMIN_HEADER, ADMIN_SCHEME, NODE_SCHEME
from app.metrics import views as metrics_views

REF = "#/components/schemas/{model}"

# Each error status in the one error shape (P5), in the same words wherever it is answered; a 426
# always carries the compatibility answer (A1).
ERRORS: dict[int, tuple[type[replies.Error], str]] = {
    400: (replies.Error, "Invalid input; `error.field` names the field"),
    401: (replies.Error, "Missing or wrong credential"),
    403: (replies.Error, "Refused"),
    404: (replies.Error, "Not found"),
    409: (replies.Error, "Conflict with the current state"),
    410: (replies.Error, "Gone: expired or revoked"),
    413: (replies.Error, "Body too large"),
    415: (replies.Error, "Body is not JSON"),
    426: (
        replies.ProtocolRefusal,
        "Protocol incompatible: `protocol_version` is missing, not a whole number, or one this control plane "
        "does not speak; `compatibility` says which (A1)",
    ),
    429: (replies.Error, "Faster than the heartbeat interval allows; wait `Retry-After` seconds"),
}
DEFAULT_ERROR = (replies.Error, "Any other error, in the same shape")

# OpenAPI links: what a reply's fields open next, so a stateful client (schemathesis) walks from a
# minted token to its node, the node's storage roots and its jobs: (method, path, status) of the
# reply → {link name: (method, path of the target, its parameters from the reply, request body)}.
_ROOT = "$response.body#/id"
LINKS: dict[tuple[str, str, int], dict[str, tuple[str, str, dict[str, str], object]]] = {
    ("post", "/api/v1/admin/node-enrollments", 201): {
        "GetEnrollment": ("get", "/api/v1/admin/node-enrollments/{enrollment_id}", {"enrollment_id": _ROOT}, None),
        "ClaimEnrollment": (
            "post",
            "/api/v1/agent/enroll",
            {},
            {
                "enrollment_token": "$response.body#/token",
                "control_plane_url": "$response.body#/api_origin",
                "node_id": "00000000-0000-4000-8000-00000000f022",
                "hostname": "linked-node",
                "protocol_version": 1,
                "agent_version": "0.1.0",
            },
        ),
    },
    ("post", "/api/v1/admin/api-keys", 201): {
        "RevokeApiKey": ("delete", "/api/v1/admin/api-keys/{api_key_id}", {"api_key_id": _ROOT}, None),
    },
    ("post", "/api/v1/admin/deployments", 201): {
        "GetDeployment": ("get", "/api/v1/admin/deployments/{deployment_id}", {"deployment_id": _ROOT}, None),
        "DeleteDeployment": ("delete", "/api/v1/admin/deployments/{deployment_id}", {"deployment_id": _ROOT}, None),
    },
    ("post", "/api/v1/agent/enroll", 201): {
        "GetNode": ("get", "/api/v1/hardware/nodes/{node_id}", {"node_id": "$response.body#/node_id"}, None),
        "CreateStorageRoot": (
            "post",
            "/api/v1/admin/nodes/{node_id}/storage-roots",
            {"node_id": "$response.body#/node_id"},
            None,
        ),
    },
    ("post", "/api/v1/admin/nodes/{node_id}/storage-roots", 201): {
        "ListStorageRoots": (
            "get",
            "/api/v1/admin/nodes/{node_id}/storage-roots",
            {"node_id": "$response.body#/node_id"},
            None,
        ),
        "DeleteStorageRoot": ("delete", "/api/v1/admin/storage-roots/{root_id}", {"root_id": _ROOT}, None),
        "AcquireOntoRoot": (
            "post",
            "/api/v1/admin/jobs",
            {},
            {
                "type": "artifact.acquire.v1",
                "node_id": "$response.body#/node_id",
                "params": {"repo_id": "owner/tiny", "storage_root_id": _ROOT},
            },
        ),
    },
    ("post", "/api/v1/admin/jobs", 201): {
        "GetJob": ("get", "/api/v1/admin/jobs/{job_id}", {"job_id": _ROOT}, None),
        "CancelJob": ("post", "/api/v1/admin/jobs/{job_id}/cancel", {"job_id": _ROOT}, None),
        "RetryJob": ("post", "/api/v1/admin/jobs/{job_id}/retry", {"job_id": _ROOT}, None),
    },
}


def _operation_ref(method: str, path: str) -> str:
    """A JSON pointer to an operation of this document (RFC 6901: `~` as ~0, `/` as ~1)."""
    return "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method


def _links(method: str, path: str, status: int) -> dict | None:
    declared = LINKS.get((method, path, status))
    if not declared:
        return None
    links = {}
    for name, (target_method, target_path, parameters, body) in declared.items():
        link: dict = {"operationRef": _operation_ref(target_method, target_path)}
        if parameters:
            link["parameters"] = dict(parameters)
        if body is not None:
            link["requestBody"] = body
        links[name] = link
    return links


def _content(carried: type[BaseModel] | Mapping[str, dict]) -> dict:
    """A body's media types: a model's JSON by reference to its component, any other by its schema."""
    if isinstance(carried, type):
        return {"application/json": {"schema": {"$ref": REF.format(model=carried.__name__)}}}
    return {media_type: {"schema": schema} for media_type, schema in carried.items()}


def _response(carried: operations.Carried, description: str) -> dict:
    if carried is None:
        return {"description": description}
    return {"description": description, "content": _content(carried)}


def _operation(declared: operations.Operation) -> dict:
    """One operation as the document writes it; every one names its errors and a default (P5)."""
    described: dict = {"summary": declared.summary}
    if declared.description:
        described["description"] = declared.description
    if declared.query:
        described["parameters"] = [
            {"name": name, "in": "query", "schema": schema} for name, schema in declared.query.items()
        ]
    if declared.body is not None:
        described["requestBody"] = {"required": True, "content": _content(declared.body)}
    errors = {status: ERRORS[status] for status in declared.errors if status not in declared.replies}
    described["responses"] = {
        **{str(status): _response(*reply) for status, reply in {**declared.replies, **errors}.items()},
        "default": _response(*DEFAULT_ERROR),
    }
    for status in declared.replies:
        if links := _links(declared.method, declared.path, status):
            described["responses"][str(status)]["links"] = links
    if declared.security:
        described["security"] = [{scheme: []} for scheme in declared.security]
    return described


def _paths() -> dict:
    """Each declared path, its path parameters once for all its operations."""
    paths: dict[str, dict] = {}
    for declared in operations.OPERATIONS:
        item = paths.setdefault(declared.path, {})
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": schema}
            for name, schema in declared.path_parameters.items()
        ]
        if parameters and item.setdefault("parameters", parameters) != parameters:
            raise ValueError(f"{declared.path}: its operations declare its path parameters differently")
        item[declared.method] = _operation(declared)
    return paths


def _models() -> list[type[BaseModel]]:
    """Every request and reply model the operations name, each once."""
    named: list[object] = [DEFAULT_ERROR[0]]
    for declared in operations.OPERATIONS:
        named += [declared.body, *(carried for carried, _ in declared.replies.values())]
        named += [ERRORS[status][0] for status in declared.errors]
    return list(dict.fromkeys(model for model in named if isinstance(model, type)))


def _schemas(models: list[type[BaseModel]]) -> dict[str, dict]:
    """The JSON Schema of each model and of the models nested in it, by name: one name, one schema."""
    schemas: dict[str, dict] = {}
    for model in models:
        generator = replies.SCHEMA_GENERATOR if issubclass(model, replies.Reply) else GenerateJsonSchema
        schema = model.model_json_schema(ref_template=REF, schema_generator=generator)
        for name, each in {**schema.pop("$defs", {}), model.__name__: schema}.items():
            if schemas.setdefault(name, each) != each:
                raise ValueError(f"Two models are named {name}: rename one (app/api/bodies.py, app/api/replies.py)")
    return schemas


# Routes this document leaves out, each with why (tests/unit/test_openapi.py checks the rest).
NOT_DESCRIBED = {
    (
        "/api/v1/agent/relay",
        "get",
    ): "a WebSocket (S5), which OpenAPI cannot describe; app/serving/relay.py says its frames",
    ("/v1/models", "get"): "OpenAI's API (S4), in OpenAI's shapes; docs/serving.md",
    ("/v1/chat/completions", "post"): "OpenAI's API (S4), in OpenAI's shapes; docs/serving.md",
    ("/v1/completions", "post"): "OpenAI's API (S4), in OpenAI's shapes; docs/serving.md",
}


@cache
def document() -> dict:
    """The OpenAPI 3.1 document."""
    import_views()  # every operation is declared before the document is assembled
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ModelForge control plane",
            "version": "1",
            "description": "Enrolment, node credentials, the outbound-only agent protocol, node read-back. "
            f"Text fields take {rules.TEXT_RULE}; a lone surrogate (such as \\ud800) is not Unicode text and "
            "is refused too, though no portable pattern can name it.",
        },
        "paths": _paths(),
        "components": {
            "schemas": _schemas(_models()),
            "securitySchemes": {
                ADMIN_SCHEME: {"type": "apiKey", "in": "header", "name": ADMIN_HEADER},
                NODE_SCHEME: {"type": "http", "scheme": "bearer"},
                metrics_views.METRICS_SCHEME: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "MODELFORGE_METRICS_TOKEN",
                },
            },
        },
    }


@cache
def query_parameters(path: str, method: str) -> frozenset[str]:
    """The query parameters the document allows for one operation."""
    operation = document()["paths"].get(path, {}).get(method, {})
    return frozenset(param["name"] for param in operation.get("parameters", []) if param["in"] == "query")


@operations.get(
    "/openapi.json",
    "This document",
    replies={200: ({"application/json": {"type": "object"}}, "OpenAPI 3.1")},
)
def openapi_json():
    """Serve the OpenAPI document."""
    response = json_response(document())
    response.headers["Cache-Control"] = "public, max-age=300"
    return response
