"""The delivery queue (O2): exactly one notification per audited transition and target.

Two rules make "once" hold across gunicorn workers and replicas:

- Enqueueing is `INSERT … SELECT … ON CONFLICT DO NOTHING` on the unique (audit event, target)
  pair, so two schedulers that both see a new event add one row between them.
- Sending starts with a conditional claim whose row count picks the one process that sends:

      UPDATE alert_deliveries SET next_attempt_at = now + CLAIM, attempts = attempts + 1
      WHERE id = :id AND state = 'pending' AND next_attempt_at <= now

  The claim moves the row's next attempt past the send's longest time, so a sender that dies
  mid-send leaves a row that comes due again (then it may arrive twice: at least once beats
  never). A failed send is retried with exponential backoff, capped, until the target answers
  or the alert is a day old.

Requests never send: they only write audit events (and the test alert its rows); the scheduler
process sends, with apprise's own timeouts, outside any database transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from app.alerts import messages
from app.alerts.targets import Target
from app.extensions import db
from app.models import AlertCursor, AlertDelivery, AlertDeliveryState, AuditEvent, Job, Node
from app.timeutil import UTCDateTime, utcnow

BACKOFF_FIRST_SECONDS = 2
BACKOFF_CAP_SECONDS = 300
GIVE_UP_AFTER = timedelta(hours=24)
# A claim outlasts apprise's connect and read timeouts (4 s each by default) with room to spare.
CLAIM_SECONDS = 60
# Sends per sweep run, and due rows read per claim (another scheduler may win some of them).
BATCH = 20
CANDIDATES = 5
# Events older than this are never alerted: schedulers down for a few minutes catch up on
# restart, but alerts turned back on after a pause (the sweep runs only while targets are
# configured) do not flood a phone with history.
MAX_EVENT_AGE = timedelta(minutes=15)
# A transaction can commit an event with a lower id after one with a higher id (PostgreSQL
# sequences are not commit-ordered), so the last few minutes are looked at again each run.
REORDER_WINDOW = timedelta(minutes=2)
CURSOR = "audit"

_deliveries = AlertDelivery.__table__
_events = AuditEvent.__table__
_cursor = AlertCursor.__table__
_INSERTS = {"sqlite": sqlite_insert, "postgresql": postgresql_insert}
_COLUMNS = [
    "audit_event_id",
    "action",
    "target_key",
    "target_label",
    "state",
    "attempts",
    "next_attempt_at",
    "created_at",
]


def backoff_seconds(attempts: int) -> int:
    """The wait after the `attempts`-th failed send: 2, 4, 8 … seconds, at most five minutes."""
    return min(BACKOFF_FIRST_SECONDS * 2 ** max(attempts - 1, 0), BACKOFF_CAP_SECONDS)


def _insert_ignoring_duplicates():
    dialect = db.session.connection().dialect.name
    return _INSERTS[dialect](_deliveries)


def _enqueue(target: Target, events: sa.Select, now: datetime) -> int:
    """Add a pending delivery to `target` for each event `events` selects (id, action) it lacks."""
    rows = events.add_columns(
        sa.literal(target.key),
        sa.literal(target.label),
        sa.literal(AlertDeliveryState.PENDING),
        sa.literal(0),
        sa.literal(now, UTCDateTime()),
        sa.literal(now, UTCDateTime()),
    ).where(~sa.exists().where(_deliveries.c.audit_event_id == _events.c.id, _deliveries.c.target_key == target.key))
    if target.since is not None:  # added in the console: nothing from before it was added
        rows = rows.where(_events.c.at >= target.since)
    statement = _insert_ignoring_duplicates().from_select(_COLUMNS, rows).on_conflict_do_nothing()
    # RETURNING counts what this statement inserted: a duplicate skipped by the conflict is absent.
    return len(db.session.execute(statement.returning(_deliveries.c.id)).all())


def _alerting() -> sa.ColumnElement[bool]:
    """The audit events that alert: an alerting action, and a node's return only from offline.

    A node that missed a heartbeat or two (stale, never offline) sent no "offline" alert, so its
    return sends none either: a flapping link must not page a phone with "back online" alone.
    """
    previous = _events.c.details["previous"].as_string()  # ->> on PostgreSQL, JSON_EXTRACT on SQLite
    return sa.and_(
        _events.c.action.in_(messages.ALERT_ACTIONS),
        sa.or_(_events.c.action != "node.returned", previous == messages.RETURNED_ALERTS_FROM),
    )


def enqueue_event(event_id: int, targets: Iterable[Target], now: datetime | None = None) -> int:
    """Queue one audited event (the test alert) for every target now; the caller commits."""
    now = now or utcnow()
    selected = sa.select(_events.c.id, _events.c.action).where(_events.c.id == event_id)
    return sum(_enqueue(target, selected, now) for target in targets)


def enqueue_new(targets: Iterable[Target], now: datetime | None = None) -> int:
    """Queue every alerting event written since the last run, for every target; commit."""
    now = now or utcnow()
    connection = db.session.connection()
    newest = connection.execute(sa.select(sa.func.coalesce(sa.func.max(_events.c.id), 0))).scalar_one()
    # The first run starts at the present: enabling alerts never sends the trail's history.
    connection.execute(
        _INSERTS[connection.dialect.name](_cursor).on_conflict_do_nothing(),
        {"name": CURSOR, "last_audit_event_id": newest},
    )
    cursor = connection.execute(sa.select(_cursor.c.last_audit_event_id).where(_cursor.c.name == CURSOR)).scalar_one()
    selected = (
        sa.select(_events.c.id, _events.c.action)
        .where(
            _alerting(),
            _events.c.at >= now - MAX_EVENT_AGE,
            sa.or_(_events.c.id > cursor, _events.c.at >= now - REORDER_WINDOW),
        )
        .order_by(_events.c.id)  # sent in the order they happened
    )
    queued = sum(_enqueue(target, selected, now) for target in targets)
    connection.execute(
        _cursor.update()
        .where(_cursor.c.name == CURSOR, _cursor.c.last_audit_event_id < newest)
        .values(last_audit_event_id=newest)
    )
    db.session.commit()
    return queued


@dataclass(frozen=True)
class Claimed:
    """A delivery this process won, with what it needs to send it outside any transaction."""

    id: int
    attempts: int
    created_at: datetime
    target: Target
    alert: messages.Alert | None


def _claim(delivery_id: int, now: datetime) -> bool:
    claimed = db.session.execute(
        _deliveries.update()
        .where(
            _deliveries.c.id == delivery_id,
            _deliveries.c.state == AlertDeliveryState.PENDING,
            _deliveries.c.next_attempt_at <= now,
        )
        .values(
            next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS),
            attempts=_deliveries.c.attempts + 1,
            last_attempt_at=now,
        )
    ).rowcount
    return claimed == 1


def _alert_for(event: AuditEvent | None) -> messages.Alert | None:
    if event is None:
        return None
    node_name = (
        db.session.scalar(sa.select(Node.display_name).where(Node.id == event.node_id)) if event.node_id else None
    )
    job_id = (event.details or {}).get("job_id")
    job_type = db.session.scalar(sa.select(Job.type).where(Job.id == str(job_id))) if job_id else None
    return messages.compose(event, node_name, job_type)


def claim_next(targets: Iterable[Target], now: datetime | None = None) -> Claimed | None:
    """Claim one due delivery, this process's alone to send; None when nothing is due. Commits.

    One at a time, just before its send: a claim never waits behind other sends, so it cannot
    lapse (and be claimed again elsewhere) while this process is still busy with a slow target.
    """
    now = now or utcnow()
    by_key = {target.key: target for target in targets}
    if not by_key:
        return None
    # Only targets this process knows: a replica configured with fewer URLs (mid-change) leaves
    # the others' deliveries to the replicas that hold their URLs.
    due = db.session.scalars(
        sa.select(AlertDelivery.id)
        .where(
            AlertDelivery.state == AlertDeliveryState.PENDING,
            AlertDelivery.next_attempt_at <= now,
            AlertDelivery.target_key.in_(by_key),
        )
        .order_by(AlertDelivery.next_attempt_at, AlertDelivery.id)
        .limit(CANDIDATES)
    ).all()
    for delivery_id in due:
        if not _claim(delivery_id, now):
            continue  # another scheduler claimed it between the read and the claim
        delivery = db.session.get(AlertDelivery, delivery_id, populate_existing=True)
        claimed = Claimed(
            id=delivery.id,
            attempts=delivery.attempts,
            created_at=delivery.created_at,
            target=by_key[delivery.target_key],
            alert=_alert_for(db.session.get(AuditEvent, delivery.audit_event_id)),
        )
        db.session.commit()  # no transaction (nor SQLite's write lock) stays open while sending
        return claimed
    db.session.commit()
    return None


def record_result(claimed: Claimed, error: str | None, now: datetime | None = None) -> str:
    """Store how the send went: sent, retry later, or failed for good. Returns the new state. Commits.

    Fenced on the attempt number, so a send whose claim had lapsed (and was claimed again) does
    not overwrite the newer attempt's outcome.
    """
    now = now or utcnow()
    if error is None:
        values = {"state": AlertDeliveryState.SENT, "sent_at": now, "last_error": None}
    elif now - claimed.created_at >= GIVE_UP_AFTER or claimed.alert is None:
        values = {"state": AlertDeliveryState.FAILED, "last_error": error[:500]}
    else:
        retry_at = now + timedelta(seconds=backoff_seconds(claimed.attempts))
        values = {"next_attempt_at": retry_at, "last_error": error[:500]}
    db.session.execute(
        _deliveries.update()
        .where(_deliveries.c.id == claimed.id, _deliveries.c.attempts == claimed.attempts)
        .values(last_attempt_at=now, **values)
    )
    db.session.commit()
    return values.get("state", AlertDeliveryState.PENDING)


@dataclass(frozen=True)
class LastResult:
    """How the most recent send to one target went, for the settings page."""

    at: datetime | None
    ok: bool
    error: str | None
    action: str
    state: str


def last_results(targets: Iterable[Target]) -> dict[str, LastResult]:
    """Each target's most recently attempted delivery (none yet: absent)."""
    results = {}
    for target in targets:
        delivery = db.session.scalar(
            sa.select(AlertDelivery)
            .where(AlertDelivery.target_key == target.key, AlertDelivery.last_attempt_at.is_not(None))
            .order_by(AlertDelivery.last_attempt_at.desc(), AlertDelivery.id.desc())
            .limit(1)
        )
        if delivery is not None:
            results[target.key] = LastResult(
                at=delivery.last_attempt_at,
                ok=delivery.state == AlertDeliveryState.SENT,
                error=delivery.last_error,
                action=delivery.action,
                state=delivery.state,
            )
    return results


def pending_count(targets: Iterable[Target]) -> int:
    """Deliveries to the configured targets still waiting to be sent (or retried)."""
    keys = [target.key for target in targets]
    if not keys:
        return 0
    return db.session.scalar(
        sa.select(sa.func.count(AlertDelivery.id)).where(
            AlertDelivery.state == AlertDeliveryState.PENDING, AlertDelivery.target_key.in_(keys)
        )
    )
