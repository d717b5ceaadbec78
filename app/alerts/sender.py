"""Sending one alert to one target through apprise, escaped for its format; why it failed, without a secret."""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, unquote, urlsplit

import apprise

from app.alerts import messages
from app.alerts.messages import Alert
from app.alerts.targets import Target
from app.redaction import redact

log = logging.getLogger("modelforge.alerts")
MAX_ERROR = 300
_SHORTEST_SECRET_PART = 4


def _secret_parts(url: str) -> list[str]:
    """Every piece of an apprise URL that may be (or hold) its service's secret, longest first."""
    parts = [url]
    try:
        split = urlsplit(url)
        parts += [split.username or "", split.password or "", split.netloc]
    except ValueError:
        split = None
    if split is not None:
        parts += [unquote(segment) for segment in split.path.split("/")]
        parts += [segment for segment in split.path.split("/")]
        for _, value in parse_qsl(split.query, keep_blank_values=True):
            parts.append(value)
    found = {part for part in parts if len(part) >= _SHORTEST_SECRET_PART}
    return sorted(found, key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """`text` on one line, short, with every part of `url` that could be secret removed (P2)."""
    for part in _secret_parts(url):
        text = text.replace(part, "…")
    text = re.sub(r"\s+", " ", text).strip()
    return redact(text)[:MAX_ERROR]


def _format_of(plugin) -> str:
    """The format apprise delivers this target's body in: its URL's `format=`, else its service's default.

    Each service declares the formats it takes (apprise 2 lets some take several, the first its
    default); the one chosen is what the alert is escaped for, and is declared as the body's format
    so apprise converts nothing.
    """
    resolve = getattr(plugin, "resolve_format", None)
    chosen = resolve(None) if callable(resolve) else plugin.notify_format
    value = str(getattr(chosen, "value", chosen)).lower()
    return value if value in (messages.TEXT, messages.MARKDOWN, messages.HTML) else messages.TEXT


def send(target: Target, alert: Alert) -> str | None:
    """Notify `target`; None when it took the alert, else why not (with no secret in it)."""
    notifier = apprise.Apprise()
    if not notifier.add(target.url):
        return "apprise could not read this target's URL"
    plugin = notifier[0]
    format_name = _format_of(plugin)
    shown = messages.render(alert, format_name, title_in_body=plugin.title_maxlen <= 0)
    # Apprise's log lines are the only account of why a service refused; they are captured here
    # (its logger does not propagate: app.alerts.targets) and scrubbed of the URL's parts.
    with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as captured:
        try:
            delivered = notifier.notify(
                body=shown.body, title=shown.title, notify_type=alert.kind, body_format=format_name
            )
        except Exception as error:  # a plugin's own bug: reported by type only, its text may quote the URL
            return f"apprise raised {type(error).__name__}"
    if delivered:
        return None
    reason = scrub(" ".join(captured.getvalue().splitlines()), target.url)
    return reason or "the service did not accept the notification"
