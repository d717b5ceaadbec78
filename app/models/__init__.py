"""SQLAlchemy models, one module per concept."""

from app.models.audit import AuditEvent
from app.models.credential import Credential
from app.models.enrollment import Enrollment, EnrollmentState
from app.models.inventory import Gpu, NodeInventory
from app.models.node import Node, NodeLease
from app.models.telemetry import TelemetrySample

__all__ = [
    "AuditEvent",
    "Credential",
    "Enrollment",
    "EnrollmentState",
    "Gpu",
    "Node",
    "NodeInventory",
    "NodeLease",
    "TelemetrySample",
]
