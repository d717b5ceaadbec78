"""Alert targets (O2): apprise URLs from the settings, each known by a masked label and a keyed digest.

An apprise URL carries its service's secret (a webhook token, a password, a topic), so the URL
itself is only ever handed to apprise: the console, the logs and the database see the label
apprise prints with `privacy=True`, and deliveries are keyed by an HMAC of the URL under a random
salt kept in the database, which names the target without revealing it.

The salt is the database's, not the control plane's secret key: every replica (each may have its
own MODELFORGE_SECRET_KEY) must name a target alike, or each would queue and send its own copy of
every alert, and rotating the secret key would orphan pending retries and the settings page's history.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import urlsplit

import apprise
import sqlalchemy as sa
from flask import current_app

from app.config import Settings
from app.db import READ_ONLY, insert_ignoring_duplicates
from app.extensions import db
from app.models import AlertCursor

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
def targets_for(urls: tuple[str, ...], salt: bytes) -> tuple[Target, ...]:
    """The configured targets, in the order given; a URL listed twice is one target."""
    found: dict[str, Target] = {}
    for url in urls:
        plugin = _plugin(url)
        if plugin is None:  # refused at start-up (app.config); never reached in a running app
            continue
        key = hmac.new(salt, url.encode(), hashlib.sha256).hexdigest()
        found.setdefault(key, Target(key=key, label=label_of(plugin), url=url))
    return tuple(found.values())


# The salt lives in the alert sweep's own state table, beside its cursor: a row of its own whose
# number is 63 random bits, so no schema of its own is needed.
SALT_ROW = "target-salt"
_SALT_CACHE = "modelforge.alert_target_salt"
_cursor = AlertCursor.__table__


def target_salt() -> bytes:
    """This database's key for target digests, created by whichever process asks first.

    `INSERT … ON CONFLICT DO NOTHING`, then read back: two replicas that race both read the row
    that won, so every process of every replica keys a target alike. Cached per app (process) once
    read; it is made on connections of its own, committed at once, so call it before the
    request's session writes (the sweep and the settings page do: it never waits on their lock).
    """
    cached = current_app.extensions.get(_SALT_CACHE)
    if cached is not None:
        return cached
    read = sa.select(_cursor.c.last_audit_event_id).where(_cursor.c.name == SALT_ROW)
    with db.engine.connect().execution_options(**{READ_ONLY: True}) as connection:
        value = connection.execute(read).scalar()
    if value is None:
        with db.engine.begin() as connection:
            connection.execute(
                insert_ignoring_duplicates(_cursor)[connection.dialect.name],
                {"name": SALT_ROW, "last_audit_event_id": secrets.randbits(63)},
            )
            value = connection.execute(read).scalar_one()
    salt = value.to_bytes(8, "big")
    current_app.extensions[_SALT_CACHE] = salt
    return salt


def configured(settings: Settings) -> tuple[Target, ...]:
    """The targets of `settings`, keyed under this database's salt (an app context is needed)."""
    return targets_for(settings.alert_urls, target_salt()) if settings.alert_urls else ()
