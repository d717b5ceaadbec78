"""What an alert says (O2): a human sentence per audited transition, never a secret.

Only the fields named here reach the text — node display name and id, the job's id, type and
error code, the actor, the hostname — never the event's whole details (which hold credential
prefixes), and anything shaped like a token is redacted as a last guard (P2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.models import AuditEvent
from app.timeutil import isoformat

TEST_ACTION = "alert.test"
# O2: the transitions that alert, in the words of the audit trail that drives them.
ALERT_ACTIONS = ("node.offline", "node.returned", "job.failed", "credential.revoked", "node.enrolled", TEST_ACTION)
# node.returned is audited for stale → online as well, a heartbeat or two missed: only a return
# from offline (which alerted) is "back online" (app.alerts.deliveries selects by it).
RETURNED_ALERTS_FROM = "offline"

# apprise's notify types: how a phone app colours or ranks the notification.
INFO, SUCCESS, WARNING, FAILURE = "info", "success", "warning", "failure"
_TOKEN_SHAPE = re.compile(r"mf[a-z]_[A-Za-z0-9_-]{6,}")
_ERROR_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_MAX_FIELD = 200


@dataclass(frozen=True)
class Alert:
    """One notification: a short title, a sentence or two, and apprise's notify type."""

    title: str
    body: str
    kind: str


def _text(value: object, fallback: str = "unknown") -> str:
    """A detail as plain one-line text, short, with anything token-shaped redacted."""
    text = " ".join(str(value).split())[:_MAX_FIELD] if value not in (None, "") else fallback
    return redact(text)


def redact(text: str) -> str:
    """The last guard: nothing shaped like an enrolment token or node credential leaves (P2)."""
    return _TOKEN_SHAPE.sub("[redacted]", text)


def compose(event: AuditEvent, node_name: str | None = None, job_type: str | None = None) -> Alert:
    """The alert for one audited transition (`node_name`, `job_type` looked up by the caller)."""
    details = event.details or {}
    at = f"{isoformat(event.at)}"
    name = _text(node_name, fallback="") or None
    node = f"{name} (node {event.node_id})" if name else f"node {event.node_id}"
    short = name or f"node {event.node_id}"
    previous = _text(details.get("previous"))
    if event.action == "node.offline":
        return Alert(
            f"Node offline: {short}",
            f"{node} has sent no heartbeat for longer than the offline threshold and is now offline "
            f"(it was {previous}). Noticed at {at}.",
            FAILURE,
        )
    if event.action == "node.returned":
        return Alert(
            f"Node back online: {short}",
            f"{node} is sending heartbeats again and is online (it was {previous}). At {at}.",
            SUCCESS,
        )
    if event.action == "job.failed":
        code = str(details.get("code") or "")
        code = code if _ERROR_CODE.fullmatch(code) else "an unknown error"
        kind = _text(job_type, fallback="unknown type")
        return Alert(
            f"Job failed on {short}: {code}",
            f"Job {_text(details.get('job_id'))} ({kind}) on {node} failed on attempt "
            f"{_text(details.get('attempt'))} with {code}. At {at}.",
            FAILURE,
        )
    if event.action == "credential.revoked":
        return Alert(
            f"Credential revoked: {short}",
            f"The credential of {node} was revoked by {_text(event.actor)}; its agent is refused until "
            f"the node is enrolled again. At {at}.",
            WARNING,
        )
    if event.action == "node.enrolled":
        again = "re-enrolled" if details.get("re_enrolled") else "enrolled"
        return Alert(
            f"Node enrolled: {short}",
            f"{node} {again} from host {_text(details.get('hostname'))}; the enrolment token it used "
            f"is now spent. At {at}.",
            INFO,
        )
    if event.action == TEST_ACTION:
        return Alert(
            "ModelForge test alert",
            f"A test alert sent from the console's settings page at {at}. If you can read this, "
            "ModelForge's alerts reach this target.",
            INFO,
        )
    return Alert(f"ModelForge: {_text(event.action)}", f"{_text(event.action)} on {node} at {at}.", INFO)
