"""Every response body, declared once, like the request bodies in app/api/bodies.py.

Each reply is a pydantic model whose `model_json_schema()` is its schema in the OpenAPI document;
each view names the models it answers with beside its route (app/api/operations.py). The views
build their payloads from the domain's `to_dict()`, and schemathesis checks every response they
send against these models (tests/unit/test_openapi.py), so the description cannot drift from them.

A reply is described, never parsed: a field with a default (`= None`) is one the reply may leave
out, and the default itself is no part of the wire format (`SCHEMA_GENERATOR` drops it).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, RootModel, StringConstraints, WithJsonSchema
from pydantic.json_schema import GenerateJsonSchema

from app import acceptance, tokens
from app.acceptance import checklist, uploads
from app.jobs import queue
from app.models import DeploymentState, EnrollmentState, JobState
from app.nodes import compat


class ReplySchema(GenerateJsonSchema):
    """JSON Schema of a reply: a field's Python default says only that the field may be absent."""

    def default_schema(self, schema: Any) -> Any:
        return self.generate_inner(schema["schema"])


SCHEMA_GENERATOR = ReplySchema


def one_of(values: Iterable[str]) -> Any:
    """One string of a set the code keeps (job types, states, checklist items): its enum follows the code."""
    return Literal[tuple(values)]


def pattern(regex: str) -> Any:
    """A string the code always writes in this shape (a secret's prefix, a digest)."""
    return Annotated[str, StringConstraints(pattern=regex)]


Uuid = Annotated[str, WithJsonSchema({"type": "string", "format": "uuid"})]
Count = Annotated[int, Field(ge=0)]


class Reply(BaseModel):
    """A JSON object the API answers with; fields it does not declare may appear beside these."""


# --- The error shape (P5) and the compatibility answer (A1) ---


class Compatibility(Reply):
    """A1: the answer to the protocol version sent, with what the operator does about it."""

    answer: one_of(compat.ANSWERS)
    protocol_version: Any = Field(description="As sent, whatever its JSON type")
    supported: list[int]
    action: str


class ErrorDetail(Reply):
    """What went wrong, in words, and what to do next; `field` names the offending field (A5)."""

    code: pattern("^[A-Z][A-Z0-9_]*$")
    message: str
    next_step: str
    field: str = None


class Error(Reply):
    """The one error shape of the API (P5); a refusal may add its facts beside `error`."""

    error: ErrorDetail
    compatibility: Compatibility = None
    expected_origin: str = None


class ProtocolRefusal(Error):
    """A1: 426 PROTOCOL_INCOMPATIBLE, always with the compatibility answer (TOO_OLD, TOO_NEW or UNKNOWN)."""

    compatibility: Compatibility


# --- Enrolment (E), credentials (I5), readiness (R) ---


class Enrollment(Reply):
    """E1, E5: an enrolment, never its token; `node_id` and `consumed_at` once it is consumed."""

    id: Uuid
    display_name: str
    state: one_of(EnrollmentState)
    token_prefix: str = None
    created_at: datetime = None
    expires_at: datetime
    api_origin: str
    role: str | None
    labels: dict[str, str]
    production_eligible: bool
    lab_eligible: bool
    benchmark_eligible: bool
    revoked_at: datetime | None = None
    node_id: str | None = None
    consumed_at: datetime | None = None


class MintedEnrollment(Enrollment):
    """E1: the new enrolment with its token, which no other reply ever shows."""

    token: pattern("^mfe_")


class Enrollments(Reply):
    """E5: enrolments, newest first."""

    enrollments: list[Enrollment]


class ApiKey(Reply):
    """S1: a client key's metadata; never the key or its digest."""

    id: Uuid
    name: str
    prefix: pattern("^" + tokens.API_KEY_PREFIX)
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None


class MintedApiKey(Reply):
    """S1: the new key, which no other reply ever shows."""

    id: Uuid
    name: str
    key: pattern("^" + tokens.API_KEY_PREFIX)
    created_at: datetime
    expires_at: datetime | None


class ApiKeys(Reply):
    """S1: every client key, newest first."""

    api_keys: list[ApiKey]


class DeploymentError(Reply):
    """S2: why a deployment failed, as the node reported it, with what to do next."""

    code: str
    message: str | None
    next_step: str | None


class DeploymentPlacement(Reply):
    """S2, S3: which node serves it, and why that one."""

    node_id: Uuid
    why: str


class Measured(Reply):
    """S2: what the node measured of the loaded model; a figure it could not read is null (P3)."""

    load_seconds: float | None = None
    memory_bytes: int | None = None
    context_length: int | None = None


class Deployment(Reply):
    """S2: a deployment; `error` while failed, `measured` once the node loaded it."""

    id: Uuid
    name: str
    state: one_of(DeploymentState)
    node_id: Uuid
    artifact_id: Uuid
    model_file: str
    tier: Literal["lab", "production"]
    context_length: int | None
    n_gpu_layers: int | None
    idle_unload_seconds: int
    placement: DeploymentPlacement
    error: DeploymentError | None
    created_at: datetime
    ready_at: datetime | None
    last_request_at: datetime | None
    measured: Measured | None


class Deployments(Reply):
    """S2: deployments, newest first."""

    deployments: list[Deployment]


class DeploymentStatus(Reply):
    """S2: the deployment's state after the node's report, as the control plane decided it."""

    id: Uuid
    state: one_of(DeploymentState)


class Credential(Reply):
    """I5: a node credential's metadata; the secret itself only in the reply that issues it."""

    id: int
    prefix: str
    created_at: datetime
    active: bool
    revoked_at: datetime | None = None
    revoked_reason: str | None = None


class RevokedCredential(Credential):
    """I5: the credential just revoked, and its node."""

    node_id: Uuid


class IssuedCredential(RevokedCredential):
    """I5: the new credential, its secret shown this once."""

    credential: pattern("^mfn_")


class ReadinessCheck(Reply):
    """R1: one check of a node's readiness and what to do when it does not pass."""

    name: Literal["connection", "inventory", "protocol", "agent_health", "telemetry"]
    status: Literal["pass", "pending", "fail"]
    detail: str
    next_step: str


class Readiness(Reply):
    """R1, R2: whether the node is ready, check by check; `node_id` is null until a node enrolled."""

    node_id: str | None
    enrollment_id: str = None
    ready: bool
    checked_at: datetime
    checks: list[ReadinessCheck]


# --- Nodes (N, I6, W1) ---


class Gpu(Reply):
    """N4: one GPU of the node as the agent last reported it."""

    uuid: str
    name: str | None
    memory_total_bytes: int | None
    driver_version: str | None
    cuda_driver_version: str | None = None
    pci_bus_id: str | None = None
    present: bool = None
    first_seen_at: datetime = None
    last_seen_at: datetime = None


class GpuReading(Reply):
    """N4: a GPU's latest telemetry; a metric NVML could not read is null (P3)."""

    gpu_uuid: Annotated[str, StringConstraints(min_length=1, max_length=96)]
    sampled_at: datetime
    utilization_gpu_percent: Annotated[float, Field(ge=0, le=100)] | None
    memory_used_bytes: Count | None
    temperature_c: float | None
    power_w: Annotated[float, Field(ge=0)] | None


class RuntimeWorker(Reply):
    """W1: the runtime worker as the agent last reported it, or why none answered."""

    reported: dict[str, Any] | None
    problem: str | None
    compatibility: Compatibility | None


class Eligibility(Reply):
    """The node's three eligibility flags (scheduler metadata)."""

    production_eligible: bool
    lab_eligible: bool
    benchmark_eligible: bool


class Node(Reply):
    """A node in the wire format: status, versions, inventory, GPUs, latest telemetry; never a secret."""

    id: Uuid
    display_name: str
    hostname: str
    status: Literal["pending", "online", "stale", "offline"]
    disabled: bool
    draining: bool = Field(description="S3: finishes what runs, takes no new job or deployment")
    draining_since: datetime | None
    last_heartbeat_at: datetime | None
    heartbeat_age_seconds: float | None
    agent_version: str | None
    protocol_version: int | None
    compatibility: Compatibility | None
    health: dict[str, Any] | None = None
    inventory: dict[str, Any] | None
    gpus: list[Gpu]
    capabilities: list[str] = None
    runtime_worker: RuntimeWorker | None = Field(None, description="W1: null when the agent never said")
    telemetry: list[GpuReading]
    eligibility: Eligibility
    credential: Credential | None
    suspected_duplicate_hostname: bool = None


class Nodes(Reply):
    """Every node."""

    nodes: list[Node]


class AuditEvent(Reply):
    """P4: one audited action."""

    id: int
    at: datetime
    actor: str
    action: str
    node_id: str | None
    details: dict[str, Any]


class AuditEvents(Reply):
    """P4: audit events, newest first."""

    audit_events: list[AuditEvent]


class Healthy(Reply):
    """The control plane is up and reaches its database."""

    status: Literal["ok"]


# --- The agent's side (A1, A2, E2, J1) ---


class _Answered(Reply):
    """What every agent reply carries: the compatibility answer and the interval to publish at (A2)."""

    compatibility: Compatibility
    heartbeat_interval_seconds: int


class Enrolled(_Answered):
    """E2: the node's credential, shown this once."""

    status: str = None
    node_id: Uuid
    credential: pattern("^mfn_")


class Accepted(_Answered):
    """N4: the publication was stored."""

    status: str


class RootToWatch(Reply):
    """J1: a storage root the agent is to observe."""

    id: Uuid
    name: str
    container_path: str
    min_free_bytes: int


class ClockWarning(Reply):
    """Issue 22: readings dated too far ahead were dropped (the heartbeat still counted), or the
    telemetry came in older than the freshness window; `offset_seconds` is positive ahead."""

    dropped_samples: Count
    dropped_observations: Count
    offset_seconds: float
    message: str
    next_step: str


class DeploymentToServe(Reply):
    """S2: a deployment the agent is to load and keep loaded (`ready`), or to stop (`stopped`)."""

    id: Uuid
    name: str
    desired: Literal["ready", "stopped"]
    container_path: str = Field(description="The artifact's directory as the agent sees it")
    model_file: str
    context_length: int | None
    n_gpu_layers: int | None


class HeartbeatAccepted(Accepted):
    """A2: recorded; `storage_roots` only when the agent's etag is out of date (J1), `deployments`
    likewise (S2); `clock_warning` only when the node's clock cost readings (issue 22);
    `finished_partial_jobs` only when a reported partial directory belongs to a job that has ended (J5)."""

    jobs_waiting: Count
    storage_roots_etag: str = None
    storage_roots: list[RootToWatch] = None
    deployments_etag: str
    deployments: list[DeploymentToServe] = None
    clock_warning: ClockWarning = None
    # J5: of the partial directories the agent reported, those of this node's jobs that have ended.
    finished_partial_jobs: list[str] = None


# --- Storage roots, jobs, artifacts, runtime results (J1–J3, W2) ---


class RootObserved(Reply):
    """J1: what the agent last saw of a root."""

    exists: bool
    writable: bool
    free_bytes: int | None
    total_bytes: int | None
    observed_at: datetime
    problem: str | None = Field(
        description="Why the agent cannot use the root (`parent not writable: …`, `is a symlink: …`, "
        "`outside the artifact directory …`); null while it can, or from an agent that does not say"
    )


class StorageRoot(Reply):
    """J1: a registered root; `observed` is null until the agent reports on it."""

    id: Uuid
    node_id: Uuid
    name: str
    host_path: str
    container_path: str
    min_free_bytes: int
    created_at: datetime
    observed: RootObserved | None


class StorageRootCreated(StorageRoot):
    """J1: the root just registered, and what its container path was checked against."""

    checked_against: str | None = Field(
        description="The artifact directory the node's agent reported, which the container path lies "
        "below; null when the node has not reported one yet: the path is then unchecked until the agent "
        "is told of the root, and `observed.problem` says if it refuses it"
    )


class StorageRoots(Reply):
    """J1: a node's storage roots."""

    storage_roots: list[StorageRoot]


class Deleted(Reply):
    """The id of what was deleted."""

    deleted: str


class JobFailure(Reply):
    """J2: why a job failed, in the API's error-code style."""

    code: str
    message: str
    next_step: str = None


class Job(Reply):
    """J2: a job as the operator sees it."""

    id: Uuid
    type: one_of(queue.TYPES)
    node_id: Uuid
    state: one_of(JobState)
    attempt: int
    max_attempts: int
    params: dict[str, Any]
    progress: dict[str, Any] | None
    result: dict[str, Any] | None
    error: JobFailure | None
    cancel_requested: bool = None
    lease_expires_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobsPage(Reply):
    """J2, J4: a page of jobs, newest first; `next_before` asks for the next page (null on the last)."""

    jobs: list[Job]
    next_before: str | None


class NodeConsidered(Reply):
    """S3: a node a benchmark without a node skipped, and the first rule it failed."""

    node_id: Uuid
    name: str
    artifact_id: Uuid | None = Field(description="The node's own copy of the model, when it holds one")
    reason: str


class BenchmarkedModel(Reply):
    """S3: the model a benchmark without a node measures: a repository at a commit, and the file."""

    repo_id: str
    repo_type: str
    commit: str
    model_file: str


class BenchmarkFanOut(Reply):
    """S3: a benchmark without a node: a job on each node that qualified, on its own copy of the
    model, and every other node with its reason."""

    model: BenchmarkedModel
    jobs: Annotated[list[Job], Field(min_length=1)]
    skipped: list[NodeConsidered]


class JobCreated(RootModel[Job | BenchmarkFanOut], Reply):
    """J2: the job queued on the node named; S3: a benchmark without `node_id` answers BenchmarkFanOut."""


class NoNodeFits(Error):
    """409: a conflict with the current state; NO_NODE_FITS (S3) lists every node with its reason."""

    nodes: list[NodeConsidered] = None


class JobOutcome(Reply):
    """J2: the job as its report left it."""

    job: Job


class AgentJob(Reply):
    """J2: a claimed job as the agent runs it, with its lease."""

    id: Uuid
    type: str
    attempt: Annotated[int, Field(ge=1)]
    max_attempts: int
    params: dict[str, Any]
    lease_expires_at: datetime
    lease_seconds: int
    progress_interval_seconds: int


class Claimed(Reply):
    """J2: the job to run."""

    job: AgentJob


class LeaseRenewed(Reply):
    """J2: the lease runs on; `cancel_requested` tells the agent to stop."""

    lease_expires_at: datetime
    cancel_requested: bool


class Artifact(Reply):
    """J3: a verified artifact on a node."""

    id: Uuid
    node_id: Uuid = None
    repo_id: str
    repo_type: Literal["model", "dataset"]
    revision: str
    commit: pattern("^[0-9a-f]{40}$")
    storage_root_id: Uuid
    container_path: str
    host_path: str
    files: int
    total_bytes: int
    verified_at: datetime
    job_id: str | None
    deleting_job_id: str | None = Field(None, description="J5: its delete job while queued or running")


class Artifacts(Reply):
    """J3: the node's verified artifacts."""

    artifacts: list[Artifact]


class EngineUsed(Reply):
    """W2: the engine a result came from, as stored; a field that cannot be read is null (P3)."""

    name: str | None = None
    version: str | None = None
    backend: str | None = None


class TokenRate(Reply):
    """W2: tokens per second over the repetitions."""

    mean: float
    stddev: float | None
    samples: list[float | None]


class _ResultOf(Reply):
    """W2: which job and model a result belongs to."""

    job_id: Uuid
    artifact_id: str | None
    repo_id: str | None
    commit: str | None
    model_file: str | None
    finished_at: datetime | None


class BenchmarkRun(_ResultOf):
    """W2: one benchmark run of a model."""

    n_gpu_layers: int | None = None
    prompt_tokens: int | None = None
    generate_tokens: int | None = None
    repetitions: int | None = None
    prompt_tokens_per_second: TokenRate | None
    generate_tokens_per_second: TokenRate | None
    time_to_first_token_seconds: float | None = None
    load_seconds: float | None = None
    peak_rss_bytes: int | None = None
    peak_gpu_memory_bytes: int | None = None
    gpu_uuids: list[str]
    engine: EngineUsed | None


class SmokeOutput(Reply):
    """W2: one prompt of the smoke test and what the model answered."""

    prompt: str | None
    text: str | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None


class SmokeTest(_ResultOf):
    """W2: the node's last smoke test."""

    outputs: list[SmokeOutput]
    engine: EngineUsed | None


class RuntimeResults(Reply):
    """W2: a node's benchmark runs per model, newest first, and its last smoke test; unreadable fields are null (P3)."""

    benchmarks: list[BenchmarkRun]
    smoke_test: SmokeTest | None


# --- Acceptance evidence (V1) ---


class AcceptanceItem(Reply):
    """V1: one item of the acceptance checklist and the evidence behind its state."""

    name: one_of(name for name, _ in acceptance.ITEMS)
    title: str
    state: one_of(checklist.STATES)
    observed_at: datetime | None
    source: str
    detail: str
    evidence: dict[str, Any]


class Acceptance(Reply):
    """V1: the node's checklist, item by item, and whether it is validated."""

    node_id: str
    validated: bool
    production_eligible: bool
    items: list[AcceptanceItem]


class Screenshot(Reply):
    """V1: an uploaded screenshot's metadata (the file itself: GET it by id)."""

    id: int
    filename: str
    content_type: one_of(uploads.EXTENSIONS)
    size_bytes: Annotated[int, Field(ge=1, le=uploads.MAX_SCREENSHOT_BYTES)]
    sha256: pattern("^[0-9a-f]{64}$")
    width: int
    height: int
    uploaded_at: datetime
