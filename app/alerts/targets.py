"""Alert targets (O2): apprise URLs from the settings, each known by a masked label and a keyed digest.

An apprise URL carries its service's secret (a webhook token, a password, a topic), so the URL
itself is only ever handed to apprise: the console, the logs and the database see the label
apprise prints with `privacy=True`, and deliveries are keyed by an HMAC of the URL under the
control plane's secret key, which names the target without revealing it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import urlsplit

import apprise

# Apprise's own log lines can quote a service's reply or a URL; they go nowhere but the capture
# in app.alerts.sender, so nothing it says reaches the control plane's log unfiltered.
logging.getLogger("apprise").propagate = False

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]{0,31}://")


@dataclass(frozen=True)
class Target:
    """One place alerts go."""

    key: str
    label: str
    url: str = field(repr=False)


def split_urls(text: str) -> list[str]:
    """The URLs in `text`, separated by whitespace or commas as apprise's own lists are.

    A comma splits only before another `scheme://`, so a URL whose query holds a comma
    (`mailto://…?to=a@x,b@y`) stays whole.
    """
    urls: list[str] = []
    for word in text.split():
        first = len(urls)
        for piece in word.split(","):
            if not piece:
                continue
            if len(urls) > first and not _SCHEME.match(piece):
                urls[-1] += "," + piece
            else:
                urls.append(piece)
    return urls


def masked_scheme(url: str) -> str:
    """What may be said of a URL apprise could not read: its scheme only."""
    match = _SCHEME.match(url)
    return f"{match.group(0)}…" if match else "(not a URL)"


def _mask_segment(segment: str) -> str:
    if not segment or "..." in segment or "*" in segment:
        return segment  # empty, or already masked by apprise
    return "..." if len(segment) <= 6 else f"{segment[0]}...{segment[-1]}"


def label_of(plugin) -> str:
    """apprise's masked URL, without its query of defaults and with every path segment masked too.

    apprise masks what each service calls a secret, but some keep the secret in the path
    (an ntfy topic, a webhook id), so the label shows scheme, host and the path's shape only.
    """
    split = urlsplit(plugin.url(privacy=True))
    path = "/".join(_mask_segment(segment) for segment in split.path.split("/"))
    return f"{split.scheme}://{split.netloc}{path}"[:300]


def _plugin(url: str):
    if not _SCHEME.match(url):
        return None
    return apprise.Apprise.instantiate(url, suppress_exceptions=True)


def unreadable(urls: list[str]) -> list[tuple[int, str]]:
    """The 1-based positions and masked schemes of URLs apprise cannot send to."""
    return [(number, masked_scheme(url)) for number, url in enumerate(urls, 1) if _plugin(url) is None]


@lru_cache(maxsize=8)
def targets_for(urls: tuple[str, ...], secret_key: str) -> tuple[Target, ...]:
    """The configured targets, in the order given; a URL listed twice is one target."""
    found: dict[str, Target] = {}
    for url in urls:
        plugin = _plugin(url)
        if plugin is None:  # refused at start-up (app.config); never reached in a running app
            continue
        key = hmac.new(secret_key.encode(), url.encode(), hashlib.sha256).hexdigest()
        found.setdefault(key, Target(key=key, label=label_of(plugin), url=url))
    return tuple(found.values())
