"""The OpenAPI 3.1 description of the API, served at GET /api/v1/openapi.json.

A test compares its paths and methods with Flask's registered routes, and schemathesis
checks every response against it, so the document and the code cannot drift apart.
"""

from __future__ import annotations

from functools import cache

from app import acceptance, rules
from app.acceptance import checklist, uploads
from app.api import bodies, bp, json_response
from app.jobs import queue
from app.models import JobState

NULLABLE_STRING = {"type": ["string", "null"]}
NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}
TIME = {"type": "string", "format": "date-time"}
UUID = {"type": "string", "format": "uuid"}
TEXT = {"type": "string", "pattern": rules.TEXT_PATTERN}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(properties: dict, required: list[str] | None = None, additional: bool = True) -> dict:
    schema: dict = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if not additional:
        schema["additionalProperties"] = False
    return schema


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict:
    described = {
        400: "Invalid input; `error.field` names the field",
        401: "Missing or wrong credential",
        403: "Refused",
        404: "Not found",
        409: "Conflict with the current state",
        410: "Gone: expired or revoked",
        413: "Body too large",
        415: "Body is not JSON",
        426: "Protocol incompatible; the body carries `compatibility`",
        429: "Faster than the heartbeat interval allows; wait `Retry-After` seconds",
    }
    responses = {str(status): _json(_ref("Error"), described[status]) for status in statuses}
    responses["default"] = _json(_ref("Error"), "Any other error, in the same shape")
    return responses


def _admin(operation: dict) -> dict:
    return {**operation, "security": [{"adminToken": []}]}


def _agent(operation: dict) -> dict:
    return {**operation, "security": [{"nodeCredential": []}]}


_BODY_MODELS: dict[str, type[bodies.Body]] = {}


def _body(model: type[bodies.Body]) -> dict:
    """A request body: the model's own schema (A5), listed under components by `document()`."""
    _BODY_MODELS[model.__name__] = model
    return {"required": True, "content": {"application/json": {"schema": _ref(model.__name__)}}}


def _body_schemas() -> dict[str, dict]:
    """The JSON Schema of every request body the paths named, and of the models nested in them."""
    schemas: dict[str, dict] = {}
    for name, model in _BODY_MODELS.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema
    return schemas


def _path_param(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


COMPATIBILITY = _obj(
    {
        "answer": {"enum": ["COMPATIBLE", "TOO_OLD", "TOO_NEW", "UNKNOWN"]},
        "protocol_version": {},
        "supported": {"type": "array", "items": {"type": "integer"}},
        "action": {"type": "string"},
    },
    ["answer", "protocol_version", "supported", "action"],
)

ENROLLMENT = _obj(
    {
        "id": UUID,
        "display_name": {"type": "string"},
        "state": {"enum": ["pending", "consumed", "revoked", "expired"]},
        "token_prefix": {"type": "string"},
        "created_at": TIME,
        "expires_at": TIME,
        "api_origin": {"type": "string"},
        "role": NULLABLE_STRING,
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "production_eligible": {"type": "boolean"},
        "lab_eligible": {"type": "boolean"},
        "benchmark_eligible": {"type": "boolean"},
        "revoked_at": NULLABLE_TIME,
        "node_id": {"type": ["string", "null"]},
        "consumed_at": NULLABLE_TIME,
    },
    [
        "id",
        "display_name",
        "state",
        "expires_at",
        "api_origin",
        "role",
        "labels",
        "production_eligible",
        "lab_eligible",
        "benchmark_eligible",
    ],
)

CREDENTIAL = _obj(
    {
        "id": {"type": "integer"},
        "prefix": {"type": "string"},
        "created_at": TIME,
        "active": {"type": "boolean"},
        "revoked_at": NULLABLE_TIME,
        "revoked_reason": NULLABLE_STRING,
    },
    ["id", "prefix", "created_at", "active"],
)

GPU = _obj(
    {
        "uuid": {"type": "string"},
        "name": NULLABLE_STRING,
        "memory_total_bytes": {"type": ["integer", "null"]},
        "driver_version": NULLABLE_STRING,
        "cuda_driver_version": NULLABLE_STRING,
        "pci_bus_id": NULLABLE_STRING,
        "present": {"type": "boolean"},
        "first_seen_at": TIME,
        "last_seen_at": TIME,
    },
    ["uuid", "name", "memory_total_bytes", "driver_version"],
)

TELEMETRY_SAMPLE = _obj(
    {
        "gpu_uuid": {"type": "string", "minLength": 1, "maxLength": 96},
        "sampled_at": TIME,
        "utilization_gpu_percent": {"type": ["number", "null"], "minimum": 0, "maximum": 100},
        "memory_used_bytes": {"type": ["integer", "null"], "minimum": 0},
        "temperature_c": {"type": ["number", "null"]},
        "power_w": {"type": ["number", "null"], "minimum": 0},
    },
    ["gpu_uuid", "sampled_at", "utilization_gpu_percent", "memory_used_bytes", "temperature_c", "power_w"],
)

# W1: the runtime worker as the agent last reported it, or why none answered; null when never told.
RUNTIME_WORKER = {
    "oneOf": [
        {"type": "null"},
        _obj(
            {
                "reported": {"type": ["object", "null"]},
                "problem": NULLABLE_STRING,
                "compatibility": {"oneOf": [{"type": "null"}, COMPATIBILITY]},
            },
            ["reported", "problem", "compatibility"],
        ),
    ]
}

NODE = _obj(
    {
        "id": UUID,
        "display_name": {"type": "string"},
        "hostname": {"type": "string"},
        "status": {"enum": ["pending", "online", "stale", "offline"]},
        "disabled": {"type": "boolean"},
        "last_heartbeat_at": NULLABLE_TIME,
        "heartbeat_age_seconds": {"type": ["number", "null"]},
        "agent_version": NULLABLE_STRING,
        "protocol_version": {"type": ["integer", "null"]},
        "compatibility": {"oneOf": [{"type": "null"}, COMPATIBILITY]},
        "health": {"type": ["object", "null"]},
        "inventory": {"type": ["object", "null"]},
        "gpus": {"type": "array", "items": GPU},
        "capabilities": {"type": "array", "items": {"type": "string"}},
        "runtime_worker": RUNTIME_WORKER,
        "telemetry": {"type": "array", "items": TELEMETRY_SAMPLE},
        "eligibility": _obj(
            {
                "production_eligible": {"type": "boolean"},
                "lab_eligible": {"type": "boolean"},
                "benchmark_eligible": {"type": "boolean"},
            },
            ["production_eligible", "lab_eligible", "benchmark_eligible"],
        ),
        "credential": {"oneOf": [{"type": "null"}, CREDENTIAL]},
        "suspected_duplicate_hostname": {"type": "boolean"},
    },
    [
        "id",
        "display_name",
        "hostname",
        "status",
        "disabled",
        "last_heartbeat_at",
        "heartbeat_age_seconds",
        "agent_version",
        "protocol_version",
        "compatibility",
        "inventory",
        "gpus",
        "telemetry",
        "eligibility",
        "credential",
    ],
)

READINESS = _obj(
    {
        "node_id": {"type": ["string", "null"]},
        "enrollment_id": {"type": "string"},
        "ready": {"type": "boolean"},
        "checked_at": TIME,
        "checks": {
            "type": "array",
            "items": _obj(
                {
                    "name": {"enum": ["connection", "inventory", "protocol", "agent_health", "telemetry"]},
                    "status": {"enum": ["pass", "pending", "fail"]},
                    "detail": {"type": "string"},
                    "next_step": {"type": "string"},
                },
                ["name", "status", "detail", "next_step"],
            ),
        },
    },
    ["node_id", "ready", "checked_at", "checks"],
)


def _list_of(items: dict) -> dict:
    return {"type": "array", "items": items}


AGENT_REPLY = {
    "status": {"type": "string"},
    "compatibility": COMPATIBILITY,
    "heartbeat_interval_seconds": {"type": "integer"},
}


def _list(items: dict) -> dict:
    return {"type": "array", "items": items}


HEARTBEAT_REPLY = {
    "jobs_waiting": {"type": "integer", "minimum": 0},
    "storage_roots_etag": {"type": "string"},
    "storage_roots": _list(
        _obj(
            {
                "id": UUID,
                "name": {"type": "string"},
                "container_path": {"type": "string"},
                "min_free_bytes": {"type": "integer"},
            },
            ["id", "name", "container_path", "min_free_bytes"],
        )
    ),
}

STORAGE_ROOT = _obj(
    {
        "id": UUID,
        "node_id": UUID,
        "name": {"type": "string"},
        "host_path": {"type": "string"},
        "container_path": {"type": "string"},
        "min_free_bytes": {"type": "integer"},
        "created_at": TIME,
        "observed": {
            "oneOf": [
                {"type": "null"},
                _obj(
                    {
                        "exists": {"type": "boolean"},
                        "writable": {"type": "boolean"},
                        "free_bytes": {"type": ["integer", "null"]},
                        "total_bytes": {"type": ["integer", "null"]},
                        "observed_at": TIME,
                    },
                    ["exists", "writable", "free_bytes", "total_bytes", "observed_at"],
                ),
            ]
        },
    },
    ["id", "node_id", "name", "host_path", "container_path", "min_free_bytes", "created_at", "observed"],
)

NULLABLE_NUMBER = {"type": ["number", "null"]}
NULLABLE_INTEGER = {"type": ["integer", "null"]}
NULLABLE_ENGINE = {
    "oneOf": [
        {"type": "null"},
        _obj({"name": NULLABLE_STRING, "version": NULLABLE_STRING, "backend": NULLABLE_STRING}),
    ]
}
RATE = {
    "oneOf": [
        {"type": "null"},
        _obj(
            {
                "mean": {"type": "number"},
                "stddev": NULLABLE_NUMBER,
                "samples": _list_of(NULLABLE_NUMBER),
            },
            ["mean", "stddev", "samples"],
        ),
    ]
}
_MODEL_OF_RESULT = {
    "job_id": UUID,
    "artifact_id": NULLABLE_STRING,
    "repo_id": NULLABLE_STRING,
    "commit": NULLABLE_STRING,
    "model_file": NULLABLE_STRING,
    "finished_at": NULLABLE_TIME,
}
# W2: a node's benchmark runs and last smoke test; a stored field that cannot be read is null (P3).
RUNTIME_RESULTS = _obj(
    {
        "benchmarks": _list_of(
            _obj(
                {
                    **_MODEL_OF_RESULT,
                    "n_gpu_layers": NULLABLE_INTEGER,
                    "prompt_tokens": NULLABLE_INTEGER,
                    "generate_tokens": NULLABLE_INTEGER,
                    "repetitions": NULLABLE_INTEGER,
                    "prompt_tokens_per_second": RATE,
                    "generate_tokens_per_second": RATE,
                    "time_to_first_token_seconds": NULLABLE_NUMBER,
                    "load_seconds": NULLABLE_NUMBER,
                    "peak_rss_bytes": NULLABLE_INTEGER,
                    "peak_gpu_memory_bytes": NULLABLE_INTEGER,
                    "gpu_uuids": _list_of({"type": "string"}),
                    "engine": NULLABLE_ENGINE,
                },
                [*_MODEL_OF_RESULT, "prompt_tokens_per_second", "generate_tokens_per_second", "gpu_uuids", "engine"],
            )
        ),
        "smoke_test": {
            "oneOf": [
                {"type": "null"},
                _obj(
                    {
                        **_MODEL_OF_RESULT,
                        "outputs": _list_of(
                            _obj(
                                {
                                    "prompt": NULLABLE_STRING,
                                    "text": NULLABLE_STRING,
                                    "prompt_tokens": NULLABLE_INTEGER,
                                    "completion_tokens": NULLABLE_INTEGER,
                                    "finish_reason": NULLABLE_STRING,
                                },
                                ["prompt", "text"],
                            )
                        ),
                        "engine": NULLABLE_ENGINE,
                    },
                    [*_MODEL_OF_RESULT, "outputs", "engine"],
                ),
            ]
        },
    },
    ["benchmarks", "smoke_test"],
)

JOB_ERROR = _obj(
    {"code": {"type": "string"}, "message": {"type": "string"}, "next_step": {"type": "string"}},
    ["code", "message"],
)

JOB = _obj(
    {
        "id": UUID,
        "type": {"enum": list(queue.TYPES)},
        "node_id": UUID,
        "state": {"enum": list(JobState)},
        "attempt": {"type": "integer"},
        "max_attempts": {"type": "integer"},
        "params": {"type": "object"},
        "progress": {"type": ["object", "null"]},
        "result": {"type": ["object", "null"]},
        "error": {"oneOf": [{"type": "null"}, JOB_ERROR]},
        "cancel_requested": {"type": "boolean"},
        "lease_expires_at": NULLABLE_TIME,
        "created_at": TIME,
        "started_at": NULLABLE_TIME,
        "finished_at": NULLABLE_TIME,
    },
    [
        "id",
        "type",
        "node_id",
        "state",
        "attempt",
        "max_attempts",
        "params",
        "progress",
        "result",
        "error",
        "lease_expires_at",
        "created_at",
        "started_at",
        "finished_at",
    ],
)

AGENT_JOB = _obj(
    {
        "id": UUID,
        "type": {"type": "string"},
        "attempt": {"type": "integer", "minimum": 1},
        "max_attempts": {"type": "integer"},
        "params": {"type": "object"},
        "lease_expires_at": TIME,
        "lease_seconds": {"type": "integer"},
        "progress_interval_seconds": {"type": "integer"},
    },
    [
        "id",
        "type",
        "attempt",
        "max_attempts",
        "params",
        "lease_expires_at",
        "lease_seconds",
        "progress_interval_seconds",
    ],
)

ARTIFACT = _obj(
    {
        "id": UUID,
        "node_id": UUID,
        "repo_id": {"type": "string"},
        "repo_type": {"enum": ["model", "dataset"]},
        "revision": {"type": "string"},
        "commit": {"type": "string", "pattern": "^[0-9a-f]{40}$"},
        "storage_root_id": UUID,
        "container_path": {"type": "string"},
        "host_path": {"type": "string"},
        "files": {"type": "integer"},
        "total_bytes": {"type": "integer"},
        "verified_at": TIME,
        "job_id": {"type": ["string", "null"]},
    },
    [
        "id",
        "repo_id",
        "repo_type",
        "revision",
        "commit",
        "storage_root_id",
        "container_path",
        "host_path",
        "files",
        "total_bytes",
        "verified_at",
        "job_id",
    ],
)

ERROR = _obj(
    {
        "error": _obj(
            {
                "code": {"type": "string", "pattern": "^[A-Z][A-Z0-9_]*$"},
                "message": {"type": "string"},
                "next_step": {"type": "string"},
                "field": {"type": "string"},
            },
            ["code", "message", "next_step"],
        ),
        "compatibility": COMPATIBILITY,
        "expected_origin": {"type": "string"},
    },
    ["error"],
)


def _paths() -> dict:
    enrollment_id = [_path_param("enrollment_id")]
    node_id = [_path_param("node_id")]
    return {
        "/healthz": {
            "get": {
                "summary": "Liveness of the control plane and its database",
                "responses": {
                    "200": _json(_obj({"status": {"const": "ok"}}, ["status"]), "Healthy"),
                    **_errors(),
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (O1): fleet, GPU, job, sweep and HTTP series",
                "description": "The Prometheus text format. Never anonymous: the operator key (in its "
                "header or as a bearer token) or MODELFORGE_METRICS_TOKEN as a bearer token.",
                "security": [{"adminToken": []}, {"metricsToken": []}],
                "responses": {
                    "200": {
                        "description": "The text exposition format 0.0.4",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **_errors(401),
                },
            }
        },
        "/api/v1/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")},
            }
        },
        "/api/v1/admin/node-enrollments": {
            "post": _admin(
                {
                    "summary": "Mint a one-time enrolment token (E1)",
                    "requestBody": _body(bodies.EnrollmentCreate),
                    "responses": {
                        "201": _json(
                            {
                                "allOf": [
                                    ENROLLMENT,
                                    _obj({"token": {"type": "string", "pattern": "^mfe_"}}, ["token"]),
                                ]
                            },
                            "Created; `token` appears here only",
                        ),
                        **_errors(400, 401, 413, 415),
                    },
                }
            ),
            "get": _admin(
                {
                    "summary": "List enrolments, newest first, without tokens",
                    "parameters": [
                        {
                            "name": "state",
                            "in": "query",
                            "schema": {"enum": ["pending", "consumed", "revoked", "expired"]},
                        }
                    ],
                    "responses": {
                        "200": _json(
                            _obj({"enrollments": {"type": "array", "items": ENROLLMENT}}, ["enrollments"]),
                            "Enrolments",
                        ),
                        **_errors(400, 401),
                    },
                }
            ),
        },
        "/api/v1/admin/node-enrollments/{enrollment_id}": {
            "parameters": enrollment_id,
            "get": _admin(
                {
                    "summary": "One enrolment",
                    "responses": {"200": _json(ENROLLMENT, "The enrolment"), **_errors(401, 404)},
                }
            ),
        },
        "/api/v1/admin/node-enrollments/{enrollment_id}/readiness": {
            "parameters": enrollment_id,
            "get": _admin(
                {
                    "summary": "Readiness of the node that consumed this enrolment (R2)",
                    "responses": {"200": _json(READINESS, "Readiness"), **_errors(401, 404)},
                }
            ),
        },
        "/api/v1/admin/node-enrollments/{enrollment_id}/revoke": {
            "parameters": enrollment_id,
            "post": _admin(
                {
                    "summary": "Revoke an unused token",
                    "responses": {"200": _json(ENROLLMENT, "Revoked"), **_errors(401, 404, 409)},
                }
            ),
        },
        "/api/v1/hardware/nodes": {
            "get": _admin(
                {
                    "summary": "All nodes",
                    "responses": {
                        "200": _json(_obj({"nodes": {"type": "array", "items": NODE}}, ["nodes"]), "Nodes"),
                        **_errors(401),
                    },
                }
            )
        },
        "/api/v1/hardware/nodes/{node_id}": {
            "parameters": node_id,
            "get": _admin({"summary": "One node", "responses": {"200": _json(NODE, "The node"), **_errors(401, 404)}}),
        },
        "/api/v1/admin/nodes/{node_id}/credential/rotate": {
            "parameters": node_id,
            "post": _admin(
                {
                    "summary": "Issue a new credential once and invalidate the old one (I5)",
                    "responses": {
                        "201": _json(
                            {
                                "allOf": [
                                    CREDENTIAL,
                                    _obj(
                                        {
                                            "credential": {"type": "string", "pattern": "^mfn_"},
                                            "node_id": UUID,
                                        },
                                        ["credential", "node_id"],
                                    ),
                                ]
                            },
                            "The new credential, shown once",
                        ),
                        **_errors(401, 404),
                    },
                }
            ),
        },
        "/api/v1/admin/nodes/{node_id}/credential/revoke": {
            "parameters": node_id,
            "post": _admin(
                {
                    "summary": "Revoke the active credential (I5)",
                    "responses": {
                        "200": _json({"allOf": [CREDENTIAL, _obj({"node_id": UUID}, ["node_id"])]}, "Revoked"),
                        **_errors(401, 404, 409),
                    },
                }
            ),
        },
        "/api/v1/admin/nodes/{node_id}/readiness": {
            "parameters": node_id,
            "get": _admin(
                {
                    "summary": "Is this exact node ready, check by check (R1, R2)",
                    "responses": {"200": _json(READINESS, "Readiness"), **_errors(401, 404)},
                }
            ),
        },
        "/api/v1/admin/nodes/{node_id}/disable": {
            "parameters": node_id,
            "post": _admin(
                {
                    "summary": "Disable the node (I6)",
                    "responses": {"200": _json(NODE, "Disabled"), **_errors(401, 404)},
                }
            ),
        },
        "/api/v1/admin/nodes/{node_id}/enable": {
            "parameters": node_id,
            "post": _admin(
                {
                    "summary": "Enable the node (I6)",
                    "responses": {"200": _json(NODE, "Enabled"), **_errors(401, 404)},
                }
            ),
        },
        "/api/v1/admin/audit-events": {
            "get": _admin(
                {
                    "summary": "Audit events, newest first (P4)",
                    "parameters": [
                        {"name": "node_id", "in": "query", "schema": TEXT},
                        {"name": "action", "in": "query", "schema": TEXT},
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                        },
                        {
                            "name": "before_id",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 2**62},
                        },
                    ],
                    "responses": {
                        "200": _json(
                            _obj(
                                {
                                    "audit_events": {
                                        "type": "array",
                                        "items": _obj(
                                            {
                                                "id": {"type": "integer"},
                                                "at": TIME,
                                                "actor": {"type": "string"},
                                                "action": {"type": "string"},
                                                "node_id": {"type": ["string", "null"]},
                                                "details": {"type": "object"},
                                            },
                                            ["id", "at", "actor", "action", "node_id", "details"],
                                        ),
                                    }
                                },
                                ["audit_events"],
                            ),
                            "Events",
                        ),
                        **_errors(400, 401),
                    },
                }
            )
        },
        "/api/v1/agent/enroll": {
            "post": {
                "summary": "Claim an enrolment token once; returns the node credential once (E2)",
                "description": "A token is single use. One exception makes a lost reply harmless: "
                "the same node_id retrying the same token before it expires, while the credential "
                "that claim issued has never been presented, gets a fresh credential and the unused "
                "one is revoked (audited as credential.reissued). Any other second claim is refused "
                "as before (409 ENROLLMENT_TOKEN_CONSUMED).",
                "requestBody": _body(bodies.EnrollRequest),
                "responses": {
                    "201": _json(
                        _obj(
                            {
                                "node_id": UUID,
                                "credential": {"type": "string", "pattern": "^mfn_"},
                                **AGENT_REPLY,
                            },
                            ["node_id", "credential", "heartbeat_interval_seconds", "compatibility"],
                        ),
                        "Enrolled",
                    ),
                    **_errors(400, 401, 409, 410, 413, 415, 426),
                },
            }
        },
        "/api/v1/agent/inventory": {
            "post": _agent(
                {
                    "summary": "Publish the node's inventory (N4)",
                    "requestBody": _body(bodies.InventoryRequest),
                    "responses": {
                        "200": _json(
                            _obj(AGENT_REPLY, ["status", "compatibility", "heartbeat_interval_seconds"]),
                            "Stored",
                        ),
                        **_errors(400, 401, 403, 413, 415, 426, 429),
                    },
                }
            )
        },
        "/api/v1/agent/heartbeat": {
            "post": _agent(
                {
                    "summary": "Publish health and telemetry; the reply carries the next interval (A2)",
                    "requestBody": _body(bodies.HeartbeatRequest),
                    "responses": {
                        "200": _json(
                            _obj(
                                {**AGENT_REPLY, **HEARTBEAT_REPLY},
                                ["status", "compatibility", "heartbeat_interval_seconds", "jobs_waiting"],
                            ),
                            "Recorded; `storage_roots` only when the agent's etag is out of date (J1)",
                        ),
                        **_errors(400, 401, 403, 413, 415, 426, 429),
                    },
                }
            )
        },
        **_job_paths(),
        **_acceptance_paths(),
    }


def _job_paths() -> dict:
    """J1–J3: storage roots, jobs and artifacts (admin), and the agent's side of jobs."""
    node_id, job_id = [_path_param("node_id")], [_path_param("job_id")]
    job_reply = _json(JOB, "The job")
    fenced = {**_errors(400, 401, 403, 404, 409, 413, 415, 426)}
    return {
        "/api/v1/admin/nodes/{node_id}/storage-roots": {
            "parameters": node_id,
            "post": _admin(
                {
                    "summary": "Register a storage root on a node (J1)",
                    "requestBody": _body(bodies.StorageRootCreate),
                    "responses": {"201": _json(STORAGE_ROOT, "Registered"), **_errors(400, 401, 404, 409, 413, 415)},
                }
            ),
            "get": _admin(
                {
                    "summary": "A node's storage roots, with what the agent last observed (J1)",
                    "responses": {
                        "200": _json(_obj({"storage_roots": _list(STORAGE_ROOT)}, ["storage_roots"]), "Roots"),
                        **_errors(401, 404),
                    },
                }
            ),
        },
        "/api/v1/admin/storage-roots/{root_id}": {
            "parameters": [_path_param("root_id")],
            "delete": _admin(
                {
                    "summary": "Forget a storage root; refused while a job uses it (J1)",
                    "responses": {
                        "200": _json(_obj({"deleted": {"type": "string"}}, ["deleted"]), "Deleted"),
                        **_errors(401, 404, 409),
                    },
                }
            ),
        },
        "/api/v1/admin/jobs": {
            "post": _admin(
                {
                    "summary": "Queue a typed job for a node (J2)",
                    "requestBody": _body(bodies.JobCreate),
                    "responses": {"201": job_reply, **_errors(400, 401, 404, 409, 413, 415)},
                }
            ),
            "get": _admin(
                {
                    "summary": "Jobs newest first, filtered; `next_before` pages on (J2, J4)",
                    "parameters": [
                        {"name": "node_id", "in": "query", "schema": TEXT},
                        {"name": "type", "in": "query", "schema": {"enum": list(queue.TYPES)}},
                        {"name": "state", "in": "query", "schema": {"enum": list(JobState)}},
                        {"name": "before", "in": "query", "schema": {**UUID, "pattern": bodies.UUID_PATTERN}},
                    ],
                    "responses": {
                        "200": _json(
                            _obj({"jobs": _list(JOB), "next_before": NULLABLE_STRING}, ["jobs", "next_before"]),
                            "Jobs",
                        ),
                        **_errors(400, 401),
                    },
                }
            ),
        },
        "/api/v1/admin/jobs/{job_id}": {
            "parameters": job_id,
            "get": _admin({"summary": "One job (J2)", "responses": {"200": job_reply, **_errors(401, 404)}}),
        },
        "/api/v1/admin/jobs/{job_id}/cancel": {
            "parameters": job_id,
            "post": _admin(
                {
                    "summary": "Cancel a queued job, or tell a running one to stop (J2)",
                    "responses": {"200": job_reply, **_errors(401, 404, 409)},
                }
            ),
        },
        "/api/v1/admin/jobs/{job_id}/retry": {
            "parameters": job_id,
            "post": _admin(
                {
                    "summary": "Run a failed or cancelled job again as a new attempt (J2)",
                    "responses": {"200": job_reply, **_errors(401, 404, 409)},
                }
            ),
        },
        "/api/v1/admin/nodes/{node_id}/artifacts": {
            "parameters": node_id,
            "get": _admin(
                {
                    "summary": "The node's verified artifacts (J3)",
                    "responses": {
                        "200": _json(_obj({"artifacts": _list(ARTIFACT)}, ["artifacts"]), "Artifacts"),
                        **_errors(401, 404),
                    },
                }
            ),
        },
        "/api/v1/admin/nodes/{node_id}/runtime-results": {
            "parameters": node_id,
            "get": _admin(
                {
                    "summary": "The node's benchmark runs per model, newest first, and its last smoke test (W2)",
                    "responses": {"200": _json(RUNTIME_RESULTS, "Results"), **_errors(401, 404)},
                }
            ),
        },
        "/api/v1/agent/jobs/claim": {
            "post": _agent(
                {
                    "summary": "The node's next job of an advertised type, or the one it runs (J2)",
                    "requestBody": _body(bodies.ClaimRequest),
                    "responses": {
                        "200": _json(_obj({"job": AGENT_JOB}, ["job"]), "Claimed, with a lease"),
                        "204": {"description": "Nothing to do"},
                        **_errors(400, 401, 403, 413, 415, 426),
                    },
                }
            )
        },
        "/api/v1/agent/jobs/{job_id}/progress": {
            "parameters": job_id,
            "post": _agent(
                {
                    "summary": "Report progress and renew the lease; fenced by the attempt (J2)",
                    "requestBody": _body(bodies.ProgressRequest),
                    "responses": {
                        "200": _json(
                            _obj(
                                {"lease_expires_at": TIME, "cancel_requested": {"type": "boolean"}},
                                ["lease_expires_at", "cancel_requested"],
                            ),
                            "Renewed",
                        ),
                        **fenced,
                    },
                }
            ),
        },
        "/api/v1/agent/jobs/{job_id}/complete": {
            "parameters": job_id,
            "post": _agent(
                {
                    "summary": "The attempt succeeded (J2, J3)",
                    "requestBody": _body(bodies.CompleteRequest),
                    "responses": {"200": _json(_obj({"job": JOB}, ["job"]), "Finished"), **fenced},
                }
            ),
        },
        "/api/v1/agent/jobs/{job_id}/fail": {
            "parameters": job_id,
            "post": _agent(
                {
                    "summary": "The attempt failed; retried while attempts remain and the class allows (J2)",
                    "requestBody": _body(bodies.FailRequest),
                    "responses": {"200": _json(_obj({"job": JOB}, ["job"]), "Recorded"), **fenced},
                }
            ),
        },
    }


ACCEPTANCE_ITEM = _obj(
    {
        "name": {"enum": [name for name, _ in acceptance.ITEMS]},
        "title": {"type": "string"},
        "state": {"enum": list(checklist.STATES)},
        "observed_at": NULLABLE_TIME,
        "source": {"type": "string"},
        "detail": {"type": "string"},
        "evidence": {"type": "object"},
    },
    ["name", "title", "state", "observed_at", "source", "detail", "evidence"],
)
ACCEPTANCE = _obj(
    {
        "node_id": {"type": "string"},
        "validated": {"type": "boolean"},
        "production_eligible": {"type": "boolean"},
        "items": _list(ACCEPTANCE_ITEM),
    },
    ["node_id", "validated", "production_eligible", "items"],
)
SCREENSHOT = _obj(
    {
        "id": {"type": "integer"},
        "filename": {"type": "string"},
        "content_type": {"enum": list(uploads.EXTENSIONS)},
        "size_bytes": {"type": "integer", "minimum": 1, "maximum": uploads.MAX_SCREENSHOT_BYTES},
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "width": {"type": "integer"},
        "height": {"type": "integer"},
        "uploaded_at": TIME,
    },
    ["id", "filename", "content_type", "size_bytes", "sha256", "width", "height", "uploaded_at"],
)


def _acceptance_paths() -> dict:
    """V1: the checklist, production eligibility, the evidence the operator gives, the bundle."""
    node_id = [_path_param("node_id")]
    base = "/api/v1/admin/nodes/{node_id}"
    limit = uploads.MAX_SCREENSHOT_BYTES
    return {
        f"{base}/acceptance": {
            "parameters": node_id,
            "get": _admin(
                {
                    "summary": "The node's acceptance checklist, item by item, and whether it is validated (V1)",
                    "responses": {"200": _json(ACCEPTANCE, "The checklist"), **_errors(401, 404)},
                }
            ),
        },
        f"{base}/production-eligibility": {
            "parameters": node_id,
            "post": _admin(
                {
                    "summary": "Set or clear production_eligible; true only on a validated node (V1)",
                    "requestBody": _body(bodies.ProductionEligibility),
                    "responses": {
                        "200": _json(ACCEPTANCE, "Set; the checklist"),
                        **_errors(400, 401, 404, 409, 413, 415),
                        "409": _json(
                            _ref("Error"),
                            "NODE_NOT_VALIDATED: `missing` and `contradicted` name the items that are not observed",
                        ),
                    },
                }
            ),
        },
        f"{base}/acceptance/container-status": {
            "parameters": node_id,
            "post": _admin(
                {
                    "summary": "Check and keep a pasted `docker inspect` of the node-agent container; environment "
                    "values and anything secret-looking are dropped before it is stored (V1)",
                    "requestBody": _body(bodies.ContainerStatus),
                    "responses": {
                        "201": _json(ACCEPTANCE_ITEM, "Checked and kept; `state` says whether every check passed"),
                        **_errors(400, 401, 404, 413, 415),
                    },
                }
            ),
        },
        f"{base}/acceptance/screenshots": {
            "parameters": node_id,
            "post": _admin(
                {
                    "summary": f"Upload one PNG or JPEG screenshot of at most {limit} bytes (V1)",
                    "description": "The file is checked to be a PNG or JPEG by its bytes (signature and "
                    "structure, down to its dimensions), never by its name or content type.",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "multipart/form-data": {
                                "schema": _obj(
                                    {"file": {"type": "string", "format": "binary", "maxLength": limit}},
                                    ["file"],
                                ),
                            }
                        },
                    },
                    "responses": {
                        "201": _json(SCREENSHOT, "Kept (the same bytes uploaded again return the kept one)"),
                        **_errors(400, 401, 404, 413, 415),
                    },
                }
            ),
        },
        f"{base}/acceptance/screenshots/{{screenshot_id}}": {
            "parameters": [
                *node_id,
                {
                    "name": "screenshot_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 1, "maximum": uploads.MAX_SCREENSHOT_ID},
                },
            ],
            "get": _admin(
                {
                    "summary": "One uploaded screenshot's file, to the operator only (V1)",
                    "responses": {
                        "200": {
                            "description": "The image",
                            "content": {
                                content_type: {"schema": {"type": "string", "format": "binary"}}
                                for content_type in uploads.EXTENSIONS
                            },
                        },
                        **_errors(401, 404),
                    },
                }
            ),
        },
        f"{base}/acceptance/export": {
            "parameters": node_id,
            "get": _admin(
                {
                    "summary": "The node's evidence bundle: a zip of report.json, report.html and screenshots/ (V1)",
                    "responses": {
                        "200": {
                            "description": "The bundle",
                            "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}},
                        },
                        **_errors(401, 404),
                    },
                }
            ),
        },
    }


@cache
def document() -> dict:
    """The OpenAPI 3.1 document."""
    paths = _paths()  # names the request bodies that `_body_schemas` then describes
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ModelForge control plane",
            "version": "1",
            "description": "Enrolment, node credentials, the outbound-only agent protocol, node read-back. "
            f"Text fields take {rules.TEXT_RULE}; a lone surrogate (such as \\ud800) is not Unicode text and "
            "is refused too, though no portable pattern can name it.",
        },
        "paths": paths,
        "components": {
            "schemas": {"Error": ERROR, **_body_schemas()},
            "securitySchemes": {
                "adminToken": {"type": "apiKey", "in": "header", "name": "X-ModelForge-Admin-Token"},
                "nodeCredential": {"type": "http", "scheme": "bearer"},
                "metricsToken": {"type": "http", "scheme": "bearer", "description": "MODELFORGE_METRICS_TOKEN"},
            },
        },
    }


@cache
def query_parameters(path: str, method: str) -> frozenset[str]:
    """The query parameters the document allows for one operation."""
    operation = document()["paths"].get(path, {}).get(method, {})
    return frozenset(param["name"] for param in operation.get("parameters", []) if param["in"] == "query")


@bp.get("/openapi.json")
def openapi_json():
    """Serve the OpenAPI document."""
    response = json_response(document())
    response.headers["Cache-Control"] = "public, max-age=300"
    return response
