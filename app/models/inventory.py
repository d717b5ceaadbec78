"""What a node last said it has (N4): host facts and GPUs."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import UTCDateTime, isoformat


class NodeInventory(db.Model):
    """The latest inventory document of a node and when it arrived."""

    __tablename__ = "node_inventories"

    node_id: Mapped[str] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True)
    facts: Mapped[dict[str, object]] = mapped_column(sa.JSON)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime)


class Gpu(db.Model):
    """One GPU of one node, keyed by its NVML UUID."""

    __tablename__ = "gpus"
    __table_args__ = (sa.UniqueConstraint("node_id", "uuid", name="uq_gpus_node_uuid"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(sa.ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    uuid: Mapped[str] = mapped_column(sa.String(96), index=True)  # app.api.auth.note_refused_credential
    name: Mapped[str | None] = mapped_column(sa.String(200))
    memory_total_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    driver_version: Mapped[str | None] = mapped_column(sa.String(64))
    cuda_driver_version: Mapped[str | None] = mapped_column(sa.String(32))
    pci_bus_id: Mapped[str | None] = mapped_column(sa.String(64))
    present: Mapped[bool] = mapped_column(default=True)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime)

    def to_dict(self) -> dict[str, object]:
        """The GPU as the API shows it."""
        return {
            "uuid": self.uuid,
            "name": self.name,
            "memory_total_bytes": self.memory_total_bytes,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "pci_bus_id": self.pci_bus_id,
            "present": self.present,
            "first_seen_at": isoformat(self.first_seen_at),
            "last_seen_at": isoformat(self.last_seen_at),
        }
