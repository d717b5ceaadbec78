"""Alert deliveries (O2): one row per (audit event, target), claimed by the one process that sends it;
and the targets added in the console."""

from __future__ import annotations

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import UTCDateTime, utcnow


class AlertDeliveryState:
    """Where a delivery stands: waiting (first try or a retry), done, or given up."""

    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


class AlertDelivery(db.Model):
    """One notification of one audited transition to one target.

    The unique (audit event, target) pair is what makes a transition alert once however many
    schedulers enqueue it; the conditional claim on `next_attempt_at` is what makes one process
    send it. The target is kept as a keyed digest of its URL and its masked label, never the URL.
    """

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        sa.UniqueConstraint("audit_event_id", "target_key", name="uq_alert_deliveries_event_target"),
        sa.Index("ix_alert_deliveries_state_next_attempt", "state", "next_attempt_at"),
        sa.Index("ix_alert_deliveries_target_attempted", "target_key", "last_attempt_at"),
    )

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    # No foreign key, like the trail itself: a delivery outlives nothing it describes.
    audit_event_id: Mapped[int] = mapped_column(sa.BigInteger)
    action: Mapped[str] = mapped_column(sa.String(64))
    target_key: Mapped[str] = mapped_column(sa.String(64))
    target_label: Mapped[str] = mapped_column(sa.String(300))
    state: Mapped[str] = mapped_column(sa.String(16), default=AlertDeliveryState.PENDING)
    attempts: Mapped[int] = mapped_column(default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(sa.String(500))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class AlertCursor(db.Model):
    """The alert sweep's state, a number per name.

    "audit": the newest audit event the sweep has looked at. "target-salt": 63 random bits, made
    once, that key every target's digest alike on every replica (app.alerts.targets).
    """

    __tablename__ = "alert_cursor"

    name: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    last_audit_event_id: Mapped[int] = mapped_column(sa.BigInteger, default=0)


# O2: the longest alert URL the console stores (apprise's own URLs are far shorter; a webhook's
# query may carry a few parameters).
MAX_TARGET_URL_LENGTH = 2000


class AlertTarget(db.Model):
    """An alert target the operator added in the console (the environment's come from app.config).

    The URL holds its service's secret, so it is kept only as a Fernet token under a key derived
    from the operator key (app.alerts.targets); the row also holds the keyed digest that names the
    target in `alert_deliveries` (unique: a URL is added once) and the masked label shown for it.
    """

    __tablename__ = "alert_targets"
    __table_args__ = (sa.UniqueConstraint("target_key", name="uq_alert_targets_target_key"),)

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    target_key: Mapped[str] = mapped_column(sa.String(64))
    label: Mapped[str] = mapped_column(sa.String(300))
    url_encrypted: Mapped[str] = mapped_column(sa.Text)
    enabled: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Added, or last enabled, at: what happened before (or while it was disabled) is not sent to it.
    enabled_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
