"""Alert targets (O2): apprise URLs from the settings and from the console, each known by a masked
label and a keyed digest.

An apprise URL carries its service's secret (a webhook token, a password, a topic), so the URL
itself is only ever handed to apprise: the console, the logs and the audit trail see the label
apprise prints with `privacy=True` (masked further), and deliveries are keyed by an HMAC of the URL
under a random salt kept in the database, which names the target without revealing it.

A target added in the console is stored as a Fernet token (P2) under a key derived with HKDF from
the operator key. Not the secret key: replicas may each have their own (below), but every replica
that serves the one console must share the operator key, so each can read what another stored.
Changing the operator key leaves a stored target unreadable: the settings page says so and offers
to remove it; nothing is sent to it meanwhile.

The salt is the database's, not the control plane's secret key: every replica (each may have its
own MODELFORGE_SECRET_KEY) must name a target alike, or each would queue and send its own copy of
every alert, and rotating the secret key would orphan pending retries and the settings page's history.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import apprise
import sqlalchemy as sa
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flask import current_app

from app import rules
from app.config import Settings
from app.db import READ_ONLY, insert_ignoring_duplicates
from app.extensions import db
from app.models import AlertCursor, AlertTarget
from app.models.alerts import MAX_TARGET_URL_LENGTH

# Apprise's own log lines can quote a service's reply or a URL; they go nowhere but the capture
# in app.alerts.sender, so nothing it says reaches the control plane's log unfiltered.
logging.getLogger("apprise").propagate = False
# A target's path can be its secret (a webhook token, an ntfy topic), and urllib3 logs each
# request's path at DEBUG: its pool logs warnings only.
logging.getLogger("urllib3.connectionpool").setLevel(logging.WARNING)

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]{0,31}://")


@dataclass(frozen=True)
class Target:
    """One place alerts go."""

    key: str
    label: str
    url: str = field(repr=False)
    # Added (or last enabled) in the console at this moment: only what happens from then on is sent
    # to it (the environment's targets are there from the start).
    since: datetime | None = None


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


# A host name, an IP address or localhost, with an optional port: shown. Anything else in the host's
# place is a service's id or secret (`ntfys://topic` for https://ntfy.sh/topic, a bot token).
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|localhost|[^.:/]+(\.[^.:/]+)+)(:\d{1,5})?$")


def _mask_host(netloc: str) -> str:
    userinfo, at, host = netloc.rpartition("@")
    if _HOST.match(host) or "..." in host or "*" in host:
        return netloc
    return f"{userinfo}{at}{_mask_segment(host)}"


def label_of(plugin) -> str:
    """apprise's masked URL, without its query of defaults and with every path segment masked too.

    apprise masks what each service calls a secret, but some keep the secret in the path
    (an ntfy topic, a webhook id) or in the host's place, so the label shows scheme, host and the
    path's shape only.
    """
    split = urlsplit(plugin.url(privacy=True))
    path = "/".join(_mask_segment(segment) for segment in split.path.split("/"))
    return f"{split.scheme}://{_mask_host(split.netloc)}{path}"[:300]


def _plugin(url: str):
    if not _SCHEME.match(url):
        return None
    return apprise.Apprise.instantiate(url, suppress_exceptions=True)


def unreadable(urls: list[str]) -> list[tuple[int, str]]:
    """The 1-based positions and masked schemes of URLs apprise cannot send to."""
    return [(number, masked_scheme(url)) for number, url in enumerate(urls, 1) if _plugin(url) is None]


def _key(salt: bytes, url: str) -> str:
    return hmac.new(salt, url.encode(), hashlib.sha256).hexdigest()


@lru_cache(maxsize=8)
def targets_for(urls: tuple[str, ...], salt: bytes) -> tuple[Target, ...]:
    """The configured targets, in the order given; a URL listed twice is one target."""
    found: dict[str, Target] = {}
    for url in urls:
        plugin = _plugin(url)
        if plugin is None:  # refused at start-up (app.config); never reached in a running app
            continue
        key = _key(salt, url)
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


def from_environment(settings: Settings) -> tuple[Target, ...]:
    """The targets of `settings`, keyed under this database's salt (an app context is needed)."""
    return targets_for(settings.alert_urls, target_salt()) if settings.alert_urls else ()


# --------------------------------------------------------------------------- added in the console

CONSOLE = "console"
_KEY_INFO = b"modelforge alert targets v1"


@lru_cache(maxsize=4)
def _fernet(operator_key: str) -> Fernet:
    """The Fernet that stores console targets: its key is HKDF-SHA256 of the operator key."""
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KEY_INFO).derive(operator_key.encode())
    return Fernet(base64.urlsafe_b64encode(key))


class TargetRefused(ValueError):
    """Why a URL cannot be added as a target, in words that never quote it (P2)."""


def _as_webhook(url: str) -> str | None:
    """An http(s) address apprise does not know as a service's, as its generic JSON webhook.

    apprise's `json(s)://` posts {"title", "message", "type", …} to the same host and path; the
    address's own query parameters travel as `-name=value`, which apprise sends as query parameters.
    """
    try:
        split = urlsplit(url)
        split.port  # noqa: B018  (raises ValueError on a port that is not a number)
    except ValueError:
        return None
    if not split.hostname:
        return None
    scheme = "jsons" if split.scheme.lower() == "https" else "json"
    query = urlencode([(f"-{name}", value) for name, value in parse_qsl(split.query, keep_blank_values=True)])
    return urlunsplit((scheme, split.netloc, split.path or "/", query, ""))


def prepare(text: str) -> str:
    """The apprise URL a console target is stored and sent as, or TargetRefused saying why not.

    An apprise URL (`ntfys://…`, `discord://…`, `json://…`) is kept as it is; so is an https://
    address apprise knows as a service's (a Discord webhook, ntfy.sh); any other http(s) address
    is a generic JSON webhook.
    """
    url = text.strip()
    if not url:
        raise TargetRefused("Enter the URL alerts should go to.")
    if len(url) > MAX_TARGET_URL_LENGTH:
        raise TargetRefused(f"That URL is {len(url)} characters long; at most {MAX_TARGET_URL_LENGTH} are kept.")
    if not rules.is_text(url) or any(character.isspace() for character in url):
        raise TargetRefused("A URL has no spaces or control characters: enter one URL.")
    if not _SCHEME.match(url):
        raise TargetRefused(
            "That is not a URL: start with https:// (a webhook) or an apprise scheme such as ntfys:// or discord://."
        )
    if _plugin(url) is not None:
        return url
    if url.split("://", 1)[0].lower() in {"http", "https"}:
        webhook = _as_webhook(url)
        if webhook is not None and _plugin(webhook) is not None:
            return webhook
        raise TargetRefused("That webhook address has no host a notification can be posted to: https://host/path.")
    raise TargetRefused(
        f"apprise cannot send to that URL ({masked_scheme(url)}): "
        "see https://github.com/caronc/apprise/wiki for each service's URL."
    )


@dataclass(frozen=True)
class Listed:
    """One target as the settings page lists it: where it comes from and, for the console's, its row."""

    key: str
    label: str
    source: str  # CONSOLE, or the variable that names it
    target: Target | None  # None: stored under another operator key, so not readable here
    row_id: str | None = None
    enabled: bool = True


def _stored(settings: Settings) -> list[Listed]:
    found = []
    fernet = _fernet(settings.operator_api_key)
    for row in db.session.scalars(sa.select(AlertTarget).order_by(AlertTarget.created_at, AlertTarget.id)):
        try:
            url = fernet.decrypt(row.url_encrypted.encode()).decode()
        except InvalidToken:
            target = None
        else:
            target = Target(key=row.target_key, label=row.label, url=url, since=row.enabled_at)
        found.append(Listed(row.target_key, row.label, CONSOLE, target, row.id, row.enabled))
    return found


def listed(settings: Settings) -> list[Listed]:
    """Every target: the environment's first (read-only), then the console's, oldest first."""
    from_env = [Listed(t.key, t.label, settings.alert_urls_source, t) for t in from_environment(settings)]
    return from_env + _stored(settings)


def configured(settings: Settings) -> tuple[Target, ...]:
    """Every target alerts go to: the environment's and the console's enabled, readable ones; a URL
    in both is one target (an app context is needed)."""
    found: dict[str, Target] = {}
    for entry in listed(settings):
        if entry.target is not None and entry.enabled:
            found.setdefault(entry.key, entry.target)
    return tuple(found.values())


def add(settings: Settings, url: str) -> AlertTarget:
    """Store `url` (already `prepare`d) as a console target; the caller audits and commits.

    TargetRefused when it is a target already, from the environment or the console (the unique
    digest refuses a second one added at the same moment elsewhere: the caller's IntegrityError).
    """
    salt = target_salt()  # before this request's writes (its own connection)
    key = _key(salt, url)
    if any(target.key == key for target in from_environment(settings)):
        raise TargetRefused(f"That target is already set in {settings.alert_urls_source}.")
    if db.session.scalar(sa.select(AlertTarget.id).where(AlertTarget.target_key == key)) is not None:
        raise TargetRefused("That target is already in the list.")
    row = AlertTarget(
        target_key=key,
        label=label_of(_plugin(url)),
        url_encrypted=_fernet(settings.operator_api_key).encrypt(url.encode()).decode(),
    )
    db.session.add(row)
    return row
