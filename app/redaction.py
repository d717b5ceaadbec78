"""P2: the shapes of secrets, one list, for everything that quotes text it did not write.

Alerts (app.alerts.messages, app.alerts.sender) and acceptance evidence (app.acceptance.secrets_scan)
both look for these: ModelForge's own tokens, the Hugging Face Hub's, and the common providers'
an operator or agent may have pasted by mistake — a hostname, a container label, an image
reference or a mount source carries them as easily as an environment variable does.
"""

from __future__ import annotations

import re

from app import tokens

REDACTED = "[redacted]"

# Each shape starts where no letter, digit or underscore runs into it ("disk-usage" holds no
# OpenAI key, "shelf_life" no Hub token), and is long enough that a word cannot look like it.
_START = r"(?<![A-Za-z0-9_])"
SECRET_SHAPES: tuple[tuple[str, str], ...] = (
    # ModelForge: the prefix and more than the characters the UI may show of it (tokens.VISIBLE_CHARS).
    (
        "ModelForge token",
        "(?:" + "|".join(map(re.escape, tokens.PREFIXES)) + rf")[A-Za-z0-9_-]{{{tokens.VISIBLE_CHARS + 1},}}",
    ),
    ("Hugging Face token", r"(?:hf|api_org)_[A-Za-z0-9]{20,}"),
    ("OpenAI-style key", r"sk-[A-Za-z0-9_-]{20,}"),
    ("GitHub token", r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"),
    ("GitLab token", r"glpat-[A-Za-z0-9_-]{20,}"),
    ("AWS access key", r"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    ("Google API key", r"AIza[A-Za-z0-9_-]{35}"),
    ("Slack token", r"xox[abeoprs]-[A-Za-z0-9-]{10,}"),
    ("Stripe key", r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    # A JSON Web Token: base64url of '{"' starts both the header and the payload.
    ("JSON Web Token", r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
    ("bearer credential", r"(?i:bearer)\s+[A-Za-z0-9._~+/-]{16,}=*"),
    ("private key", r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
)
# A URL's password (`scheme://user:password@host`): the password alone is the secret.
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,31}://[^\s/:@]*:)[^\s/@]+(@)")
_SHAPE = re.compile(_START + "(?:" + "|".join(f"(?:{pattern})" for _, pattern in SECRET_SHAPES) + ")")


def looks_secret(text: str) -> bool:
    """Whether `text` holds anything shaped like a secret: a token of SECRET_SHAPES or a URL's password."""
    return _SHAPE.search(text) is not None or _URL_PASSWORD.search(text) is not None


def redact(text: str) -> str:
    """`text` with every secret-shaped part replaced by REDACTED (a URL keeps its user and host)."""
    return _URL_PASSWORD.sub(rf"\g<1>{REDACTED}\g<2>", _SHAPE.sub(REDACTED, text))
