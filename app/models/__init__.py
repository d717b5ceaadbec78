"""SQLAlchemy models, one module per concept."""

from app.models.acceptance import AcceptanceEvidence, AcceptanceScreenshot
from app.models.alerts import AlertCursor, AlertDelivery, AlertDeliveryState, AlertTarget
from app.models.api_key import ApiKey
from app.models.audit import AuditEvent
from app.models.credential import Credential
from app.models.deployment import Deployment, DeploymentState
from app.models.enrollment import Enrollment, EnrollmentState
from app.models.inventory import Gpu, NodeInventory
from app.models.jobs import Artifact, Job, JobState, StorageRoot
from app.models.node import Node, NodeLease
from app.models.scheduling import SweepTick
from app.models.session import OperatorSession
from app.models.telemetry import TelemetryRollup, TelemetrySample

__all__ = [
    "AcceptanceEvidence",
    "AcceptanceScreenshot",
    "AlertCursor",
    "AlertDelivery",
    "AlertDeliveryState",
    "AlertTarget",
    "ApiKey",
    "Artifact",
    "AuditEvent",
    "Credential",
    "Deployment",
    "DeploymentState",
    "Enrollment",
    "EnrollmentState",
    "Gpu",
    "Job",
    "JobState",
    "Node",
    "NodeInventory",
    "NodeLease",
    "OperatorSession",
    "StorageRoot",
    "SweepTick",
    "TelemetryRollup",
    "TelemetrySample",
]
