"""What an alert says (O2): a human sentence per audited transition, never a secret, never markup.

Only the fields named here reach the text — node display name and id, the job's id, type and
error code, the actor, the hostname — never the event's whole details (which hold credential
prefixes), and anything shaped like a secret (app.redaction: ModelForge, Hub and provider tokens)
is redacted as a last guard (P2).

An agent writes some of those fields (its hostname, its display name), so they are inert in every
service (P5): a mention (`@everyone`, `<!channel>`) pings nobody, and neither a Markdown link nor
a bare URL becomes a link — even where a service renders Markdown in plain text, as Discord does.
`render` then escapes the whole message for the format its target is sent in.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, replace

from app.models import AuditEvent
from app.redaction import redact
from app.timeutil import isoformat

TEST_ACTION = "alert.test"
# O2: the transitions that alert, in the words of the audit trail that drives them.
ALERT_ACTIONS = ("node.offline", "node.returned", "job.failed", "credential.revoked", "node.enrolled", TEST_ACTION)
# node.returned is audited for stale → online as well, a heartbeat or two missed: only a return
# from offline (which alerted) is "back online" (app.alerts.deliveries selects by it).
RETURNED_ALERTS_FROM = "offline"

# apprise's notify types: how a phone app colours or ranks the notification.
INFO, SUCCESS, WARNING, FAILURE = "info", "success", "warning", "failure"
_ERROR_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_MAX_FIELD = 200


@dataclass(frozen=True)
class Alert:
    """One notification: a short title, a sentence or two, and apprise's notify type."""

    title: str
    body: str
    kind: str


# A zero-width space breaks what a service would act on and shows nothing: after `@` (Discord,
# Slack, Mattermost, Matrix and Telegram mentions), after `<` before `!`, `@` or `#` (Slack's
# <!channel>, <@U123>, <#C123>), between a Markdown link's `]` and `(`, and inside `://`.
_BREAK = "\u200b"
_MENTION = re.compile(r"@|<(?=[!@#])|\](?=\()|:(?=//)")


def neutralise(text: str) -> str:
    """Text an agent wrote, shown as it is but inert: no mention, no link."""
    return _MENTION.sub(lambda found: found[0] + _BREAK, text)


def _text(value: object, fallback: str = "unknown") -> str:
    """A detail as plain one-line text, short, secret-shaped parts redacted, mentions and links inert."""
    text = " ".join(str(value).split())[:_MAX_FIELD] if value not in (None, "") else fallback
    return neutralise(redact(text))


# apprise's formats (apprise.NotifyFormat's values) and how text is made literal in each.
TEXT, MARKDOWN, HTML = "text", "markdown", "html"
# CommonMark shows a backslash-escaped punctuation character as itself; these are the ones that
# start emphasis, code, links, autolinks, HTML, entities, headings, lists, quotes or tables.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~=&])")


def escape(text: str, format_name: str) -> str:
    """`text` as literal text in that format: Markdown backslash-escaped, HTML entity-escaped, text as it is."""
    if format_name == MARKDOWN:
        return _MARKDOWN_SPECIAL.sub(r"\\\1", text)
    if format_name == HTML:
        return html.escape(text, quote=True)
    return text


def render(alert: Alert, format_name: str, title_in_body: bool) -> Alert:
    """The alert as a target of that format is sent it: the body escaped, and the title too where the
    service shows it inside the body (`title_in_body`, apprise's title_maxlen of 0) or renders
    Markdown in it; a title a service keeps as a field of its own (an e-mail subject) stays text."""
    escaped_title = format_name == MARKDOWN or title_in_body
    return replace(
        alert,
        title=escape(alert.title, format_name) if escaped_title else alert.title,
        body=escape(alert.body, format_name),
    )


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
