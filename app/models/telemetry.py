"""Measured per-GPU telemetry samples (N4): what NVML read, never invented (P3)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import UTCDateTime, isoformat


class TelemetrySample(db.Model):
    """One GPU sample; a metric NVML could not read stays NULL."""

    __tablename__ = "telemetry_samples"
    __table_args__ = (
        sa.Index("ix_telemetry_node_gpu_time", "node_id", "gpu_uuid", "sampled_at"),
        sa.Index("ix_telemetry_sampled_at", "sampled_at"),
    )

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    node_id: Mapped[str] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"))
    gpu_uuid: Mapped[str] = mapped_column(sa.String(96))
    sampled_at: Mapped[datetime] = mapped_column(UTCDateTime)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime)
    utilization_gpu_percent: Mapped[float | None] = mapped_column(sa.Float)
    memory_used_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    temperature_c: Mapped[float | None] = mapped_column(sa.Float)
    power_w: Mapped[float | None] = mapped_column(sa.Float)

    def to_dict(self) -> dict[str, object]:
        """The sample in the wire format."""
        return {
            "gpu_uuid": self.gpu_uuid,
            "sampled_at": isoformat(self.sampled_at),
            "utilization_gpu_percent": self.utilization_gpu_percent,
            "memory_used_bytes": self.memory_used_bytes,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
        }
