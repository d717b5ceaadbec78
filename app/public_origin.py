"""The API origin agents are told to use (E3), for the API and the console alike.

With MODELFORGE_PUBLIC_API_ORIGIN set, that is the origin. Without it, the request's own Host is,
and a Host is only believed where it could have reached this server (issue 22): a control plane
listening on loopback only (MODELFORGE_BIND's default, `make run`) with no trusted proxy in front
is reached under a loopback name alone, so any other name — DNS rebinding, a hand-made request —
is refused before anything is minted. Listening on every address, or behind trusted proxies, any
name may be right, so it is recorded and the wizard says where it came from (`origin_warning`).
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from flask import request

from app.config import current_settings, normalize_origin
from app.errors import DomainError

# A DNS name (letters, digits, hyphens; dot-separated labels, an optional final dot) or an IPv4
# address, then an optional port; or a bracketed IPv6 address and an optional port.
_NAME = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)(?:\.(?!-)[a-z0-9-]{1,63}(?<!-))*\.?", re.IGNORECASE)
_HOST = re.compile(r"(?P<name>[^:\[\]]+)(?::(?P<port>[0-9]{1,5}))?")
_BRACKETED = re.compile(r"\[(?P<address>[0-9a-f:.]+)\](?::(?P<port>[0-9]{1,5}))?", re.IGNORECASE)


def _valid_host(host: str) -> bool:
    """Whether a Host header value is a name or address with an optional port 1–65535."""
    if bracketed := _BRACKETED.fullmatch(host):
        try:
            ipaddress.IPv6Address(bracketed["address"])
        except ValueError:
            return False
        port = bracketed["port"]
    elif plain := _HOST.fullmatch(host):
        if not _NAME.fullmatch(plain["name"]) or len(plain["name"]) > 253:
            return False
        port = plain["port"]
    else:
        return False
    return port is None or 1 <= int(port) <= 65535


def _name(host: str) -> str:
    """The name or address of a Host (or bind) value, without brackets, port or final dot, lower case."""
    if bracketed := _BRACKETED.fullmatch(host):
        return bracketed["address"].lower()
    return host.rpartition(":")[0].lower().rstrip(".") if ":" in host else host.lower().rstrip(".")


def is_loopback(name: str) -> bool:
    """Whether a host name or address can only mean this machine: localhost, *.localhost, 127/8, ::1."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_loopback_origin(origin: str) -> bool:
    """Whether an origin names this machine only (http://127.0.0.1:8000, http://localhost): no other host reaches it."""
    return is_loopback(urlsplit(origin).hostname or "")


def loopback_only(settings) -> bool:
    """Whether nothing but this machine can reach the control plane directly: bound to loopback, no proxy trusted."""
    bind = settings.bind
    return not settings.trusted_proxy_hops and not bind.startswith(("unix:", "fd://")) and is_loopback(_name(bind))


def current_api_origin() -> str:
    """E3: the origin agents must use — MODELFORGE_PUBLIC_API_ORIGIN, else this request's own.

    A Host header that makes no valid origin is refused (P5) before anything is minted, rather
    than recorded as `http:///` or left for the wizard to trip over after minting; so is one that
    names another host while the control plane listens on loopback only.
    """
    settings = current_settings()
    configured = settings.public_api_origin
    if configured:
        return configured
    host = request.host
    origin = normalize_origin(f"{request.scheme}://{host}") if _valid_host(host) else None
    if origin is not None and loopback_only(settings) and not is_loopback(_name(host)):
        raise DomainError(
            "HOST_HEADER_INVALID",
            f"The Host header {host[:100]!r} names another host, but this control plane listens on "
            f"{settings.bind} (loopback) only, so agents could not reach it there; nothing was minted.",
            "Reach the console at a loopback address (localhost), or set MODELFORGE_PUBLIC_API_ORIGIN "
            "(or MODELFORGE_TRUSTED_PROXY_HOPS behind a proxy) to the origin agents use.",
            header="Host",
        )
    if origin is None:
        raise DomainError(
            "HOST_HEADER_INVALID",
            f"The Host header {host[:100]!r} does not make a valid origin, so agents could not be told "
            "where to connect; nothing was minted.",
            "Reach the control plane by its host name or address, or set MODELFORGE_PUBLIC_API_ORIGIN "
            "(recommended in production).",
            header="Host",
        )
    return origin


def origin_warning() -> str | None:
    """Why the wizard should say where its origin came from: it is the request's Host and may be wrong."""
    settings = current_settings()
    if settings.public_api_origin or loopback_only(settings):
        return None
    return (
        f"This origin comes from the address your browser used ({request.host[:100]}), because "
        "MODELFORGE_PUBLIC_API_ORIGIN is not set. If agents reach the control plane under another name, "
        "set MODELFORGE_PUBLIC_API_ORIGIN to it before you mint a token."
    )
