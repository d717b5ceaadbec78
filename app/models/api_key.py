"""Client API keys (S1): stored as SHA-256, looked up by that digest, never the key itself."""

from __future__ import annotations

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.timeutil import UTCDateTime, isoformat, utcnow

# S1: a key's name, as an operator writes it (the API, the console and the column agree).
MAX_NAME_LENGTH = 200


class ApiKey(db.Model):
    """A client key for the serving API (`mfk_…`); the secret exists only in the reply that mints it."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    name: Mapped[str] = mapped_column(sa.String(MAX_NAME_LENGTH))
    # The one indexed lookup each client request makes (unique: a digest names one key).
    key_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    prefix: Mapped[str] = mapped_column(sa.String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Written at most once a minute per key (app.serving.api_keys.LAST_USED_RESOLUTION).
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    def to_dict(self) -> dict[str, object]:
        """The key as the API lists it: metadata only, never the secret or its digest."""
        return {
            "id": self.id,
            "name": self.name,
            "prefix": self.prefix,
            "created_at": isoformat(self.created_at),
            "last_used_at": isoformat(self.last_used_at),
            "expires_at": isoformat(self.expires_at),
            "revoked_at": isoformat(self.revoked_at),
        }
