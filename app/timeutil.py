"""Timezone-aware UTC time, stored the same way on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


def isoformat(moment: datetime | None) -> str | None:
    """RFC 3339 with a `Z`, or None."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_rfc3339(text: str) -> datetime | None:
    """Parse an RFC 3339 timestamp that carries an offset; None if it is not one."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        if moment.tzinfo is None:
            return None
        return moment.astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: year 1 or 9999 pushed past the range
        return None


class UTCDateTime(sa.types.TypeDecorator):
    """A datetime that goes in and comes out as aware UTC.

    SQLite has no time zones, so values are stored as naive UTC there and made aware on the
    way out; PostgreSQL uses `timestamptz`.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
