"""Enrolment tokens, node credentials and client API keys (P2, S1): 256-bit, prefixed, stored only as SHA-256."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import NamedTuple

ENROLLMENT_TOKEN_PREFIX = "mfe_"
NODE_CREDENTIAL_PREFIX = "mfn_"
API_KEY_PREFIX = "mfk_"  # S1: a client key for the serving API
PREFIXES = (ENROLLMENT_TOKEN_PREFIX, NODE_CREDENTIAL_PREFIX, API_KEY_PREFIX)
# How much of a secret the UI may show to tell two apart: the prefix and six characters.
VISIBLE_CHARS = 6


class IssuedSecret(NamedTuple):
    """A freshly minted secret: shown once, then only `digest` and `visible_prefix` remain."""

    secret: str
    digest: str
    visible_prefix: str


def digest(secret: str) -> str:
    """The SHA-256 hex digest under which a secret is stored and looked up."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def issue(prefix: str) -> IssuedSecret:
    """Mint a 256-bit secret with a recognisable prefix."""
    secret = prefix + secrets.token_urlsafe(32)
    return IssuedSecret(secret, digest(secret), secret[: len(prefix) + VISIBLE_CHARS])


def same_digest(stored_digest: str, presented_secret: str) -> bool:
    """Constant-time check that a presented secret matches a stored digest."""
    return hmac.compare_digest(stored_digest, digest(presented_secret))


def same_secret(expected: str, presented: str) -> bool:
    """Constant-time comparison of two secrets of possibly different length."""
    return hmac.compare_digest(digest(expected), digest(presented))
