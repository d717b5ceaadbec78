"""The API origin agents are told to use (E3), for the API and the console alike."""

from __future__ import annotations

import ipaddress
import re

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


def current_api_origin() -> str:
    """E3: the origin agents must use — MODELFORGE_PUBLIC_API_ORIGIN, else this request's own.

    A Host header that makes no valid origin is refused (P5) before anything is minted, rather
    than recorded as `http:///` or left for the wizard to trip over after minting.
    """
    configured = current_settings().public_api_origin
    if configured:
        return configured
    host = request.host
    origin = normalize_origin(f"{request.scheme}://{host}") if _valid_host(host) else None
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
