"""Every request body, declared once (A5, P5).

Each body is a pydantic model: the same declaration validates the request and, through
`model_json_schema()`, is the body's schema in the OpenAPI document (app/api/openapi.py). A limit
written here is therefore the limit the code enforces and the limit the document states;
schemathesis checks both ways (tests/unit/test_openapi.py). The two rules that no static schema can state
— a reading's time against the control plane's clock, GPU UUIDs unique within one inventory — are
said in the schema's description and checked in one place each: the UUIDs here, the clock where
readings are stored (app/nodes/publishing.py), which drops a reading it cannot date rather than
refusing the heartbeat that carries the node's liveness (issue 22).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar, get_args

import annotated_types
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    RootModel,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from app import rules
from app.acceptance.container import MAX_INSPECT_CHARS
from app.api.validation import invalid
from app.jobs import queue, runtime
from app.models.api_key import MAX_NAME_LENGTH as MAX_API_KEY_NAME_LENGTH
from app.models.telemetry import METRICS
from app.nodes import compat, publishing
from app.nodes.enrollment import MAX_EXPIRY_SECONDS, MIN_EXPIRY_SECONDS
from app.serving import api_keys, deployments
from app.timeutil import parse_rfc3339

MAX_GPUS = 64
EARLIEST_SAMPLE = datetime(2020, 1, 1, tzinfo=UTC)


def _spaces_trimmed(value: str) -> str:
    return value.strip(" ")


def _blank_as_none(value: str | None) -> str | None:
    return (value.strip(" ") or None) if value is not None else None


def text(max_length: int) -> Any:
    """A required string of printable text with something besides spaces; stored without outer spaces."""
    return Annotated[
        str,
        StringConstraints(min_length=1, max_length=max_length, pattern=rules.REQUIRED_TEXT_PATTERN),
        AfterValidator(_spaces_trimmed),
    ]


def optional_text(max_length: int) -> Any:
    """An optional string of printable text; null, empty or only spaces mean none."""
    return Annotated[
        str | None,
        StringConstraints(max_length=max_length, pattern=rules.TEXT_PATTERN),
        AfterValidator(_blank_as_none),
    ]


def _labels(value: dict[str, str] | None) -> dict[str, str]:
    for key, text_value in (value or {}).items():
        if problem := rules.label_problem(key, text_value):
            raise ValueError(problem)
    return dict(value or {})


Labels = Annotated[
    dict[str, str] | None,
    Field(max_length=rules.MAX_LABELS),
    AfterValidator(_labels),
    WithJsonSchema(
        {
            "type": ["object", "null"],
            "maxProperties": rules.MAX_LABELS,
            "propertyNames": {"pattern": rules.LABEL_KEY_PATTERN},
            "additionalProperties": {
                "type": "string",
                "maxLength": rules.MAX_LABEL_VALUE_LENGTH,
                "pattern": rules.TEXT_PATTERN,
            },
        }
    ),
]


def _sample_time(value: str) -> datetime:
    moment = parse_rfc3339(value)
    if moment is None:
        raise ValueError("must be an RFC 3339 time with an offset")
    return moment


# RFC 3339 with an offset, in a year from 2020 on (the upper bound moves with the clock: said in words).
RFC3339_PATTERN = (
    r"^(20[2-9][0-9]|2[1-9][0-9]{2}|[3-9][0-9]{3})-[0-9]{2}-[0-9]{2}"
    r"[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)
SampleTime = Annotated[
    str,
    StringConstraints(max_length=64, pattern=RFC3339_PATTERN),
    AfterValidator(_sample_time),
    Field(
        json_schema_extra={
            "format": "date-time",
            "description": f"RFC 3339 with an offset, after {EARLIEST_SAMPLE.year}. A reading dated more than "
            f"{publishing.MAX_CLOCK_AHEAD.seconds // 60} minutes ahead of the control plane's clock is dropped, "
            "not stored, and the heartbeat still counts; the reply's `clock_warning` says how many and why "
            "(issue 22: check the node's clock)",
        }
    ),
]


def _whole(value: object) -> object:
    """JSON has one number type: 900.0 is the whole number 900 (as JSON Schema's "integer" says)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


def whole(minimum: int, maximum: int) -> Any:
    """A whole number within bounds (a JSON boolean is not one)."""
    return Annotated[int, annotated_types.Interval(ge=minimum, le=maximum), BeforeValidator(_whole)]


def _number(minimum: float, maximum: float) -> Any:
    """A finite number within bounds, or null when NVML could not read it (P3)."""
    return Annotated[float | None, Field(ge=minimum, le=maximum)]


Bytes = whole(0, rules.MAX_BYTES)


class Body(BaseModel):
    """Strict JSON types (no "1" for 1, no true for 1); unknown fields are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", hide_input_in_errors=True)


class Versions(Body):
    """A1: what every agent request says about itself."""

    # Any JSON value is read, never refused as malformed: `versions_of` answers it first, with 426 and
    # the compatibility object for anything but a supported whole number, so only those reach here.
    protocol_version: Annotated[
        Any,
        Field(
            description="The agent protocol it speaks (A1). A value of any JSON type is read: anything but a "
            "whole number this control plane speaks is answered 426 with `compatibility` (UNKNOWN for what "
            f"is not a whole number in 0–{compat.MAX_PROTOCOL_VERSION}, TOO_OLD or TOO_NEW for one it does not "
            "speak), never a 400.",
            json_schema_extra={"examples": [1]},
        ),
    ]
    agent_version: text(64)


class AgentVersion(Body):
    """The agent version alone, checked before the compatibility answer (A1)."""

    agent_version: text(64)


class EnrollmentCreate(Body):
    """E1: what an operator asks for when minting a token."""

    model_config = ConfigDict(extra="forbid")

    display_name: text(200)
    expires_in_seconds: whole(MIN_EXPIRY_SECONDS, MAX_EXPIRY_SECONDS)
    role: optional_text(100) = None
    labels: Labels = None
    production_eligible: bool = Field(
        False,
        description="Requested only: the node is made production eligible once its acceptance evidence "
        "validates it (V1, POST /api/v1/admin/nodes/{id}/production-eligibility).",
    )
    lab_eligible: bool = False
    benchmark_eligible: bool = False


class ApiKeyCreate(Body):
    """S1: a client key to mint; without an expiry it lasts until revoked."""

    model_config = ConfigDict(extra="forbid")

    name: text(MAX_API_KEY_NAME_LENGTH)
    expires_in_seconds: whole(api_keys.MIN_EXPIRY_SECONDS, api_keys.MAX_EXPIRY_SECONDS) | None = None


def _origin_pattern() -> str:
    """An http(s) URL whose origin `normalize_origin` reads: RFC 3986 host (name, IPv4 or IPv6), port ≤ 65535."""
    h16 = "[0-9A-Fa-f]{1,4}"
    octet = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
    ls32 = rf"({h16}:{h16}|{octet}(\.{octet}){{3}})"
    ipv6 = "|".join(
        [
            rf"({h16}:){{6}}{ls32}",
            rf"::({h16}:){{5}}{ls32}",
            rf"({h16})?::({h16}:){{4}}{ls32}",
            rf"(({h16}:){{0,1}}{h16})?::({h16}:){{3}}{ls32}",
            rf"(({h16}:){{0,2}}{h16})?::({h16}:){{2}}{ls32}",
            rf"(({h16}:){{0,3}}{h16})?::{h16}:{ls32}",
            rf"(({h16}:){{0,4}}{h16})?::{ls32}",
            rf"(({h16}:){{0,5}}{h16})?::{h16}",
            rf"(({h16}:){{0,6}}{h16})?::",
        ]
    )
    name = r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?"
    port = r"(:([0-9]{0,4}|[0-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9][0-9]|655[0-2][0-9]|6553[0-5]))?"
    rest = f"[^{rules.FORBIDDEN_CHARACTERS}]"  # the text rule's characters, for the path, query and fragment
    return rf"^[Hh][Tt][Tt][Pp][Ss]?://({name}|\[({ipv6})\]){port}([/?#]{rest}*)?$"


OriginUrl = Annotated[
    str, StringConstraints(max_length=2000, pattern=_origin_pattern()), Field(json_schema_extra={"format": "uri"})
]


UUID_PATTERN = r"^[0-9A-Fa-f]{8}(-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}$"
Uuid = Annotated[
    str, StringConstraints(pattern=UUID_PATTERN), AfterValidator(str.lower), Field(json_schema_extra={"format": "uuid"})
]


class EnrollRequest(Versions):
    """E2, E3: an agent claims its enrolment token."""

    enrollment_token: text(200)
    node_id: Uuid
    hostname: text(255)
    control_plane_url: OriginUrl
    display_name: optional_text(200) = None


class GpuFacts(Body):
    """N4: one GPU as NVML reports it; each length is its column's (app/models/inventory.py)."""

    uuid: text(96)
    name: optional_text(200) = None
    memory_total_bytes: Bytes | None = None
    driver_version: optional_text(64) = None
    cuda_driver_version: optional_text(32) = None
    pci_bus_id: optional_text(64) = None


class _KeysByPattern:
    """A mapping's schema: the key rule in `propertyNames`, the value in `additionalProperties`.

    pydantic states a constrained key as `patternProperties`, which lets a key that does not match
    through with any value — looser than the code (schemathesis's positive cases would find it).
    """

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        schema = handler(core_schema)
        patterns = schema.pop("patternProperties", None)
        if patterns:
            ((pattern, value),) = patterns.items()
            schema["propertyNames"] = {**schema.get("propertyNames", {}), "pattern": pattern}
            schema["additionalProperties"] = value
        return schema


def mapping(key: Any, value: Any, max_items: int) -> Any:
    """A JSON object of at most `max_items` keys, each key and value by its own rule."""
    return Annotated[dict[key, value], Field(max_length=max_items), _KeysByPattern()]


# N4: the named data directories (state, hf-cache, artifacts, quarantine) and the facts a reason is
# given for are short names; a reason is one line of an error message.
FactName = Annotated[str, StringConstraints(pattern=rules.ROOT_NAME_PATTERN)]
GpuKey = Annotated[str, StringConstraints(min_length=1, max_length=96, pattern=rules.REQUIRED_TEXT_PATTERN)]
Reason = optional_text(500)
Reasons = mapping(FactName, Reason, 32)
MAX_CPUS = 2**20


class StorageFacts(Body):
    """N4: one named data directory: its total and free bytes, or why they are unknown; R1: why the
    agent cannot use it (missing, not a directory, not writable), which also degrades its health."""

    path: optional_text(rules.MAX_PATH_LENGTH) = None
    total_bytes: Bytes | None = None
    free_bytes: Bytes | None = None
    unknown_reason: Reason = None
    problem: Reason = None


class AgentFacts(Body):
    """N4: the agent's own version and the Python it runs on; V1: this run's start id and time."""

    version: optional_text(64) = None
    python: optional_text(32) = None
    # V1: random per agent process, so a restart is seen as a new id (the restart identity item).
    start_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")] | None = None
    started_at: Annotated[str, StringConstraints(max_length=64, pattern=RFC3339_PATTERN)] | None = None


# V1: nvidia-smi's CSV, a line per GPU of at most a few hundred characters; the agent caps it too.
MAX_NVIDIA_SMI_OUTPUT = 16 * 1024


class NvidiaSmiFacts(Body):
    """V1: what `nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader`
    printed on the node (`output`), or why it could not be run (`problem`)."""

    output: Annotated[str, StringConstraints(max_length=MAX_NVIDIA_SMI_OUTPUT, pattern=r"^[^\x00]*$")] | None = None
    problem: Reason = None
    exit_status: whole(-256, 255) | None = None


class InventoryFacts(Body):
    """N4: the node's facts as the agent collects them, each declared and bounded like any body.

    A fact this control plane does not know is dropped, not refused: a newer agent that reports one
    more fact keeps publishing its inventory (and stays ready) instead of being locked out, and
    nothing undeclared is ever stored or rendered (P5).
    """

    hostname: optional_text(255) = None
    os: optional_text(200) = None
    kernel: optional_text(200) = None
    architecture: optional_text(64) = None
    cpu_model: optional_text(200) = None
    # A cgroup CPU limit may be fractional (1.5 CPUs); a whole count stays whole (16, not 16.0).
    cpu_count: Annotated[float, Field(ge=0, le=MAX_CPUS, allow_inf_nan=False), AfterValidator(_whole)] | None = None
    cpu_limited_by_cgroup: bool | None = None
    memory_total_bytes: Bytes | None = None
    memory_limited_by_cgroup: bool | None = None
    storage: mapping(FactName, StorageFacts, 16) = {}
    accelerator_mode: optional_text(32) = None
    gpu_unknown_reasons: mapping(GpuKey, Reasons, MAX_GPUS) = {}
    unknown_reasons: Reasons = {}
    agent: AgentFacts | None = None
    nvidia_smi: NvidiaSmiFacts | None = None
    gpus: Annotated[
        list[GpuFacts],
        Field(max_length=MAX_GPUS, json_schema_extra={"description": "Each GPU UUID at most once"}),
    ]

    @field_validator("gpus")
    @classmethod
    def _one_uuid_once(cls, gpus: list[GpuFacts]) -> list[GpuFacts]:
        if len({gpu.uuid for gpu in gpus}) != len(gpus):
            raise ValueError("lists one GPU UUID twice")
        return gpus


Capabilities = Annotated[list[text(64)], Field(max_length=32)]


class Engine(Body):
    """W2: an engine the runtime worker runs models with (llama.cpp, its version, cpu or cuda)."""

    name: text(64)
    version: optional_text(64) = None
    backend: optional_text(32) = None


class WorkerDevice(Body):
    """W1: a GPU as the runtime worker sees it."""

    uuid: text(96)
    name: optional_text(200) = None
    memory_total_bytes: Bytes | None = None


# A1, W1: any whole number or short text is read, so that even a garbage value reaches the control
# plane and is answered (UNKNOWN) rather than refused with the whole inventory.
_MAX_WORKER_PROTOCOL_TEXT = 32
_WorkerProtocolInput = whole(-(2**53), 2**53) | text(_MAX_WORKER_PROTOCOL_TEXT) | None


def _worker_protocol_version(value: object) -> int | str | None:
    """A whole number or a short printable text, as sent; anything else is refused with one message."""
    value = _whole(value)
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 2**53):
        return value
    if isinstance(value, str) and len(value) <= _MAX_WORKER_PROTOCOL_TEXT and value.strip(" ") and rules.is_text(value):
        return value
    raise ValueError(f"must be a whole number, or printable text of at most {_MAX_WORKER_PROTOCOL_TEXT} characters")


WorkerProtocolVersion = Annotated[
    int | str | None,
    PlainValidator(_worker_protocol_version, json_schema_input_type=_WorkerProtocolInput),
    Field(json_schema_extra={"examples": [1]}),
]


class RuntimeWorkerFacts(Body):
    """W1: what the runtime worker said about itself (its GET /v1/info), as the agent relays it."""

    worker_version: text(64)
    protocol_version: WorkerProtocolVersion
    engines: Annotated[list[Engine], Field(max_length=8)] = []
    devices: Annotated[list[WorkerDevice], Field(max_length=MAX_GPUS)] = []


class InventoryRequest(Versions):
    """N4: the agent publishes its inventory, and the job types it can run (J2); W1: its runtime worker,
    or why none answered."""

    inventory: InventoryFacts
    capabilities: Capabilities = []
    runtime_worker: RuntimeWorkerFacts | None = None
    runtime_worker_problem: optional_text(500) = None


class Health(Body):
    """The agent's own verdict on itself."""

    status: Literal["ok", "degraded", "failing"]
    detail: optional_text(1000) = None


class TelemetrySample(Body):
    """N4: one GPU's readings; each metric is present, null when NVML cannot read it (P3)."""

    gpu_uuid: text(96)
    sampled_at: SampleTime
    utilization_gpu_percent: _number(0, 100)
    memory_used_bytes: Bytes | None
    temperature_c: _number(-100, 200)
    power_w: _number(0, 100_000)


assert tuple(name for name in TelemetrySample.model_fields if name in METRICS) == METRICS


# J5: a job id as it names a partial directory (`<root>/.partial/<job_id>/`), the agent's JOB_ID_PATTERN;
# one report names at most this many per root (the agent reports more once these are gone).
PARTIAL_JOB_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
MAX_PARTIAL_JOBS = 64
# Directories a measurement could not read (or did not, its bounds reached): its figure is then at least.
UnreadDirs = whole(0, 2**31)


class RootUsage(Body):
    """J5: what one root holds, as the agent measured it (at most once a minute): bytes of regular
    files, symlinks neither followed nor counted. A figure is null when the root could not be read
    at all, and a lower bound when `*_unread_dirs` is not 0; an agent that reports no `usage` says
    nothing, which is shown as unknown, never 0."""

    artifacts_bytes: Bytes | None = None
    artifacts_unread_dirs: UnreadDirs = 0
    partials_bytes: Bytes | None = None
    partials_unread_dirs: UnreadDirs = 0
    partial_jobs: Annotated[
        list[Annotated[str, StringConstraints(pattern=PARTIAL_JOB_PATTERN)]],
        Field(
            max_length=MAX_PARTIAL_JOBS,
            json_schema_extra={"description": "Jobs with a partial directory here; the reply names the finished ones"},
        ),
    ] = []


class QuarantineUsage(Body):
    """J5: the node's quarantine directory (one for all roots), measured like a root's use."""

    quarantine_bytes: Bytes | None = None
    quarantine_unread_dirs: UnreadDirs = 0


class RootObservation(Body):
    """J1: what the agent saw of one storage root it was told about; J5: and what it holds."""

    id: Uuid
    exists: bool
    writable: bool
    free_bytes: Bytes | None
    total_bytes: Bytes | None
    observed_at: SampleTime
    usage: RootUsage | None = None
    # J1: why the agent cannot use the root (it creates a missing one when it may); none while it can.
    problem: Reason = None


class HeartbeatRequest(Versions):
    """A2, L2: liveness, health and telemetry; J1: the storage roots the agent knows and sees; J5:
    the quarantine's use, sent with them."""

    health: Health
    telemetry: Annotated[list[TelemetrySample], Field(max_length=MAX_GPUS)] = []
    storage_roots_etag: optional_text(64) = None
    storage_roots: Annotated[list[RootObservation], Field(max_length=MAX_GPUS)] = []
    quarantine_usage: QuarantineUsage | None = None
    # S2: the agent's copy of its deployments list; the reply carries the list only when it differs.
    deployments_etag: optional_text(64) = None


AbsolutePath = Annotated[
    str,
    StringConstraints(max_length=rules.MAX_PATH_LENGTH, pattern=rules.ABSOLUTE_PATH_PATTERN),
    AfterValidator(lambda path: path.rstrip("/")),
]


class StorageRootCreate(Body):
    """J1: a root the operator registers on a node; host and container paths are separate facts."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, StringConstraints(pattern=rules.ROOT_NAME_PATTERN)]
    host_path: AbsolutePath
    container_path: AbsolutePath
    min_free_bytes: Bytes


RepoId = Annotated[str, StringConstraints(max_length=rules.MAX_REPO_ID_LENGTH, pattern=rules.REPO_ID_PATTERN)]
Revision = Annotated[
    str, StringConstraints(min_length=1, max_length=rules.MAX_REVISION_LENGTH, pattern=rules.REVISION_PATTERN)
]
Patterns = Annotated[list[text(rules.MAX_PATTERN_LENGTH)] | None, Field(max_length=rules.MAX_PATTERNS)]


class AcquireParams(Body):
    """J3: which repository revision to download onto which root."""

    model_config = ConfigDict(extra="forbid")

    repo_id: RepoId
    revision: Revision = "main"
    repo_type: Literal["model", "dataset"] = "model"
    storage_root_id: Uuid
    allow_patterns: Patterns = None
    ignore_patterns: Patterns = None


ModelFile = Annotated[
    str,
    StringConstraints(max_length=rules.MAX_PATH_LENGTH, pattern=rules.RELATIVE_PATH_PATTERN),
    Field(json_schema_extra={"description": f"The model file, {rules.RELATIVE_PATH_RULE}"}),
]


def bounded(bound: runtime.Bound) -> Any:
    """A whole-number runtime param within its bounds (app/jobs/runtime.py)."""
    return whole(bound.minimum, bound.maximum)


DeploymentName = Annotated[
    str,
    StringConstraints(max_length=rules.MAX_DEPLOYMENT_NAME_LENGTH, pattern=rules.DEPLOYMENT_NAME_PATTERN),
    Field(json_schema_extra={"description": f"What clients send as OpenAI's `model`: {rules.DEPLOYMENT_NAME_RULE}"}),
]


class DeploymentCreate(Body):
    """S2: serve one model file of an acquired artifact under a name; without node_id, placed (S3)."""

    model_config = ConfigDict(extra="forbid")

    name: DeploymentName
    artifact_id: Uuid
    model_file: ModelFile
    node_id: Uuid | None = None
    tier: Literal[deployments.TIERS] = deployments.DEFAULT_TIER
    context_length: bounded(deployments.CONTEXT_LENGTH) | None = Field(
        None, description="Null: the model's own, capped at 8192 by the worker"
    )
    n_gpu_layers: bounded(deployments.N_GPU_LAYERS) | None = Field(None, description="Null or -1: every layer")
    idle_unload_seconds: bounded(deployments.IDLE_UNLOAD_SECONDS) = deployments.IDLE_UNLOAD_SECONDS.default


class NodeEligibility(Body):
    """S3: the flags an operator sets at will; production_eligible has its own, evidence-checked path."""

    model_config = ConfigDict(extra="forbid")

    lab_eligible: bool | None = None
    benchmark_eligible: bool | None = None


class DeploymentMove(Body):
    """S3: move a deployment; without node_id it is placed on the best node but its own."""

    model_config = ConfigDict(extra="forbid")

    node_id: Uuid | None = None


class BenchmarkParams(Body):
    """W2: measure a GGUF model of one of the node's artifacts as llama-bench does."""

    model_config = ConfigDict(extra="forbid")

    artifact_id: Uuid
    model_file: ModelFile
    n_gpu_layers: bounded(runtime.N_GPU_LAYERS) = runtime.N_GPU_LAYERS.default
    prompt_tokens: bounded(runtime.PROMPT_TOKENS) = runtime.PROMPT_TOKENS.default
    generate_tokens: bounded(runtime.GENERATE_TOKENS) = runtime.GENERATE_TOKENS.default
    repetitions: bounded(runtime.REPETITIONS) = runtime.REPETITIONS.default


# A prompt is sent as written: outer spaces are part of it (no trimming, unlike other text).
Prompt = Annotated[
    str, StringConstraints(min_length=1, max_length=runtime.MAX_PROMPT_LENGTH, pattern=rules.REQUIRED_TEXT_PATTERN)
]


class GenerateParams(Body):
    """W2: complete prompts at temperature 0 with a fixed seed — the smoke test that a model answers."""

    model_config = ConfigDict(extra="forbid")

    artifact_id: Uuid
    model_file: ModelFile
    prompts: Annotated[list[Prompt], Field(min_length=1, max_length=runtime.MAX_PROMPTS)]
    max_tokens: bounded(runtime.MAX_TOKENS) = runtime.MAX_TOKENS.default


class _JobCreate(Body):
    model_config = ConfigDict(extra="forbid")

    node_id: Uuid
    max_attempts: whole(1, queue.MAX_ATTEMPTS) = queue.DEFAULT_MAX_ATTEMPTS


class AcquireJobCreate(_JobCreate):
    """J3: download a repository revision onto one of the node's roots."""

    type: Literal["artifact.acquire.v1"]
    params: AcquireParams


class BenchmarkJobCreate(_JobCreate):
    """W2: benchmark a model file of one of the node's artifacts; S3: without `node_id`, on every
    benchmark-eligible node that holds the model."""

    node_id: Uuid | None = Field(
        None,
        description="Null or left out (S3): one job on every node that is benchmark-eligible, may receive work, "
        "runs the type and holds a copy of the model that `params.artifact_id` names (the same repository at the "
        "same commit, any node's copy names it), each on its own copy; the reply lists the jobs and every other "
        "node with why, or 409 NO_NODE_FITS when no node qualifies",
    )
    type: Literal["runtime.benchmark.v1"]
    params: BenchmarkParams


class GenerateJobCreate(_JobCreate):
    """W2: run prompts through a model file of one of the node's artifacts."""

    type: Literal["runtime.generate.v1"]
    params: GenerateParams


class DeleteParams(Body):
    """J5: which of the node's artifacts to remove from its disk."""

    model_config = ConfigDict(extra="forbid")

    artifact_id: Uuid


class DeleteJobCreate(_JobCreate):
    """J5: remove one of the node's artifacts (DELETE /api/v1/admin/artifacts/{id} queues this too)."""

    type: Literal["artifact.delete.v1"]
    params: DeleteParams


_JOB_CREATES = (AcquireJobCreate, BenchmarkJobCreate, GenerateJobCreate, DeleteJobCreate)
assert tuple(model.model_fields["type"].annotation.__args__[0] for model in _JOB_CREATES) == queue.TYPES


class JobCreate(  # the union is _JOB_CREATES, spelled out for the type checker (asserted below)
    RootModel[
        Annotated[
            AcquireJobCreate | BenchmarkJobCreate | GenerateJobCreate | DeleteJobCreate, Field(discriminator="type")
        ]
    ]
):
    """J2: a typed job for one node; `type` decides which params go with it."""


assert get_args(JobCreate.model_fields["root"].annotation) == _JOB_CREATES


class ProductionEligibility(Body):
    """V1: set or clear a node's production_eligible flag; true only on a validated node."""

    model_config = ConfigDict(extra="forbid")

    production_eligible: bool


class ContainerStatus(Body):
    """V1: the output of `docker inspect` (or `podman inspect`) of the node-agent container, as pasted."""

    model_config = ConfigDict(extra="forbid")

    inspect: Annotated[str, StringConstraints(min_length=1, max_length=MAX_INSPECT_CHARS, pattern=r"^[^\x00]*$")]


class ClaimRequest(Versions):
    """J2: an agent asks for work of the types it can run."""

    capabilities: Capabilities


Count = whole(0, 10_000_000)


class Progress(Body):
    """How far an attempt has come; runtime jobs (W2) add their phase and steps beside zero bytes and files."""

    bytes_done: Bytes
    bytes_total: Bytes | None = None
    files_done: Count
    files_total: Count | None = None
    phase: optional_text(32) = None
    steps_done: Count | None = None
    steps_total: Count | None = None

    def stored(self) -> dict[str, object]:
        """The report as the job keeps it: an acquire's exactly as before, the runtime fields only when sent."""
        done = self.model_dump()
        for name in ("phase", "steps_done", "steps_total"):
            if done[name] is None:
                del done[name]
        return done


Attempt = whole(1, 1000)


class ProgressRequest(Versions):
    """J2: progress renews the lease; the attempt is the fencing token."""

    attempt: Attempt
    progress: Progress


HeaderCount = whole(1, 1 << 40)


class ModelFacts(Body):
    """S3: what one GGUF file's header says (agent/modelforge_agent_gguf.py), or `problem`: why the
    header cannot be believed. A count the header leaves out is null."""

    problem: text(500) | None = None
    architecture: Annotated[str, StringConstraints(pattern=r"^[a-z0-9_.-]{1,64}$")] | None = None
    file_bytes: Bytes | None = None
    block_count: HeaderCount | None = None
    embedding_length: HeaderCount | None = None
    feed_forward_length: HeaderCount | None = None
    head_count: HeaderCount | None = None
    head_count_kv: HeaderCount | None = None
    key_length: HeaderCount | None = None
    value_length: HeaderCount | None = None
    context_length: HeaderCount | None = None
    vocab_size: HeaderCount | None = None
    tensor_count: Count | None = None
    weights_bytes: Bytes | None = None
    weights_by_type: (
        Annotated[dict[Annotated[str, StringConstraints(pattern=r"^[A-Z0-9_]{1,16}$")], Bytes], Field(max_length=64)]
        | None
    ) = None
    layer_bytes: Bytes | None = None
    input_bytes: Bytes | None = None
    other_bytes: Bytes | None = None

    @model_validator(mode="after")
    def _facts_or_problem(self) -> ModelFacts:
        if self.problem is None and (self.architecture is None or self.weights_bytes is None):
            raise ValueError("a model's facts need architecture and weights_bytes, or a problem")
        return self


class AcquireResult(Body):
    """J3: what an acquire left on the node; S3: each GGUF file's header facts, by path."""

    commit: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]
    container_path: AbsolutePath
    files: Count
    total_bytes: Bytes
    models: Annotated[dict[ModelFile, ModelFacts], Field(max_length=64)] | None = None


Seconds = Annotated[float, Field(ge=0, le=10**9, allow_inf_nan=False)]
TokensPerSecond = Annotated[float, Field(ge=0, le=10**12, allow_inf_nan=False)]
GpuUuids = Annotated[list[text(96)], Field(max_length=MAX_GPUS)]


class Rate(Body):
    """W2: tokens per second over the repetitions: mean, sample standard deviation and each run's figure."""

    mean: TokensPerSecond
    stddev: TokensPerSecond
    samples: Annotated[list[TokensPerSecond], Field(min_length=1, max_length=runtime.MAX_SAMPLES)]


class BenchmarkResult(Body):
    """W2: what a runtime.benchmark.v1 measured (the worker's result, with artifact_id and model_file)."""

    artifact_id: Uuid
    model_file: ModelFile
    engine: Engine
    model_bytes: Bytes | None = None
    n_gpu_layers: bounded(runtime.N_GPU_LAYERS)
    gpu_uuids: GpuUuids
    load_seconds: Seconds
    prompt_tokens: bounded(runtime.PROMPT_TOKENS)
    generate_tokens: bounded(runtime.GENERATE_TOKENS)
    repetitions: bounded(runtime.REPETITIONS)
    prompt_tokens_per_second: Rate
    generate_tokens_per_second: Rate
    time_to_first_token_seconds: Seconds | None
    # P3: null when it could not be read (no GPU: NVML has nothing to say), never invented.
    peak_rss_bytes: Bytes | None
    peak_gpu_memory_bytes: Bytes | None


class GenerateOutput(Body):
    """W2: one prompt and the text the model gave back; the text may hold any character but NUL."""

    prompt: Prompt
    text: Annotated[str, StringConstraints(max_length=runtime.MAX_OUTPUT_LENGTH, pattern=r"^[^\x00]*$")]
    prompt_tokens: Count
    completion_tokens: Count
    finish_reason: optional_text(32) = None


class GenerateResult(Body):
    """W2: what a runtime.generate.v1 returned (the worker's result, with artifact_id and model_file)."""

    artifact_id: Uuid
    model_file: ModelFile
    engine: Engine
    seed: whole(-(2**31), 2**32 - 1)
    temperature: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
    max_tokens: bounded(runtime.MAX_TOKENS)
    gpu_uuids: GpuUuids
    load_seconds: Seconds
    outputs: Annotated[list[GenerateOutput], Field(min_length=1, max_length=runtime.MAX_PROMPTS)]


class DeleteResult(Body):
    """J5: what artifact.delete.v1 removed (nothing, when the directory was already gone)."""

    artifact_id: Uuid
    removed_files: Count
    freed_bytes: Bytes


# J2, W2, J5: the result each job type completes with.
RESULTS: dict[str, type[Body]] = {
    queue.ACQUIRE: AcquireResult,
    queue.BENCHMARK: BenchmarkResult,
    queue.GENERATE: GenerateResult,
    queue.DELETE: DeleteResult,
}
assert tuple(RESULTS) == queue.TYPES


def _an_object(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("must be an object")
    return value


class CompleteRequest(Versions):
    """J2: the attempt succeeded; `result` has the shape of the job's type, checked once the job is known."""

    attempt: Attempt
    result: Annotated[
        dict[str, Any],
        PlainValidator(
            _an_object, json_schema_input_type=AcquireResult | BenchmarkResult | GenerateResult | DeleteResult
        ),
        Field(json_schema_extra={"description": "The result of the job's own type"}),
    ]


assert set(get_args(CompleteRequest.model_fields["result"].metadata[0].json_schema_input_type)) == set(RESULTS.values())


class JobError(Body):
    """Why an attempt failed, in the API's error-code style."""

    code: Annotated[str, StringConstraints(max_length=64, pattern=r"^[A-Z][A-Z0-9_]*$")]
    message: text(1000)


class FailRequest(Versions):
    """J2: the attempt failed; `retryable` is the agent's class of the failure."""

    attempt: Attempt
    error: JobError
    retryable: bool


class DeploymentFailure(Body):
    """S2: why a deployment failed on the node, in the API's error-code style."""

    code: Annotated[str, StringConstraints(max_length=64, pattern=r"^[A-Z][A-Z0-9_]*$")]
    message: text(1000)


class DeploymentMeasured(Body):
    """S2: what the node measured of a loaded deployment (memory: GPU by NVML, else RSS)."""

    load_seconds: Seconds | None = None
    memory_bytes: Bytes | None = None
    context_length: Count | None = None


class DeploymentStatusRequest(Versions):
    """S2: the node reports what became of one of its deployments."""

    state: Literal[deployments.REPORTED]
    error: DeploymentFailure | None = None
    measured: DeploymentMeasured | None = None


# Messages in the API's own words, by pydantic error type; `{…}` are filled from the error's context.
_MESSAGES = {
    "missing": "is required",
    "string_type": "must be a string",
    "string_unicode": "must be valid Unicode text",
    "string_too_short": "must not be empty",
    "string_too_long": "must be at most {max_length} characters",
    "string_pattern_mismatch": "must be printable text, not empty, without control characters",
    "int_type": "must be a whole number",
    "float_type": "must be a number or null",
    "bool_type": "must be true or false",
    "greater_than_equal": "must be at least {ge}",
    "less_than_equal": "must be at most {le}",
    "finite_number": "must be a finite number",
    "model_type": "must be an object",
    "dict_type": "must be an object",
    "list_type": "must be a list",
    "too_long": "must have at most {max_length} items",
    "literal_error": "must be one of {expected}",
    "extra_forbidden": "is not a known field",
    "too_short": "must have at least {min_length} item(s)",
    "union_tag_invalid": "must be one of {expected_tags}",
    "union_tag_not_found": "is required",
}
# J2: the job type tags a JobCreate by; pydantic puts the tag in an error's location, the API does not.
_UNION_TAGS = frozenset(queue.TYPES)


def _field_name(location: tuple[str | int, ...], prefix: str = "") -> str:
    """('telemetry', 0, 'sampled_at') → 'telemetry[0].sampled_at'; a union's tag is left out."""
    name = prefix
    for part in location:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part != "[key]" and part not in _UNION_TAGS:
            name += f".{part}" if name else str(part)
    return name


# A pattern that is a rule of its own says which rule, not the generic printable-text words.
_PATTERN_MESSAGES = {
    rules.RELATIVE_PATH_PATTERN: f"must be {rules.RELATIVE_PATH_RULE}",
    rules.DEPLOYMENT_NAME_PATTERN: f"must be {rules.DEPLOYMENT_NAME_RULE}",
}


def _message(error: dict[str, Any]) -> str:
    if error["type"] == "value_error":
        return str(error["ctx"]["error"])
    if error["type"] == "string_pattern_mismatch" and error["ctx"]["pattern"] in _PATTERN_MESSAGES:
        return _PATTERN_MESSAGES[error["ctx"]["pattern"]]
    template = _MESSAGES.get(error["type"])
    if template is None:
        return "is not valid"
    return template.format(**error.get("ctx", {}))


BodyModel = TypeVar("BodyModel", bound=BaseModel)


def parse(model: type[BodyModel], data: dict[str, Any], prefix: str = "") -> BodyModel:
    """The body (or the part of it at `prefix`) as `model`, or a 400 naming the first offending field (A5)."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False, include_input=False)[0]
        location = first["loc"]
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            location = (*location, first["ctx"]["discriminator"].strip("'"))
        raise invalid(_field_name(location, prefix), _message(first)) from None


def job_create(data: dict[str, Any]) -> AcquireJobCreate | BenchmarkJobCreate | GenerateJobCreate | DeleteJobCreate:
    """J2: a job to create, its params checked against its type's model."""
    return parse(JobCreate, data).root


def result_of(job_type: str, result: dict[str, Any]) -> Body:
    """J2, W2: a completed attempt's result in the shape of its job's type; a 400 names `result.<field>`."""
    return parse(RESULTS[job_type], result, prefix="result")
