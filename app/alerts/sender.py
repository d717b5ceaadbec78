"""Sending one alert to one target through apprise, and saying why it failed without a secret."""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, unquote, urlsplit

import apprise

from app.alerts.messages import Alert, redact
from app.alerts.targets import Target

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


def send(target: Target, alert: Alert) -> str | None:
    """Notify `target`; None when it took the alert, else why not (with no secret in it)."""
    notifier = apprise.Apprise()
    if not notifier.add(target.url):
        return "apprise could not read this target's URL"
    # Apprise's log lines are the only account of why a service refused; they are captured here
    # (its logger does not propagate: app.alerts.targets) and scrubbed of the URL's parts.
    with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as captured:
        try:
            delivered = notifier.notify(body=alert.body, title=alert.title, notify_type=alert.kind)
        except Exception as error:  # a plugin's own bug: reported by type only, its text may quote the URL
            return f"apprise raised {type(error).__name__}"
    if delivered:
        return None
    reason = scrub(" ".join(captured.getvalue().splitlines()), target.url)
    return reason or "the service did not accept the notification"
