"""P2 for V1 evidence: nothing secret is stored with the evidence, and the read-back is checked for it."""

from __future__ import annotations

import re

import sqlalchemy as sa

from app import redaction
from app.extensions import db
from app.models import Credential, Enrollment

REMOVED = "[removed]"
# A name that says it holds a secret (environment variables, labels, fields).
SECRET_NAME = re.compile(r"token|secret|passw|private|api[_-]?key|(^|[^a-z])key([^a-z]|$)|hash", re.IGNORECASE)


def secret_looking_name(name: str) -> bool:
    """Whether a variable, label or field name says it holds a secret (token, secret, password, key…)."""
    return bool(SECRET_NAME.search(name))


def _known_secrets(node_id: str) -> set[str]:
    """What must never appear in a node's evidence: its credential and enrolment hashes, the operator's keys."""
    from app.config import current_settings

    settings = current_settings()
    known = {settings.operator_api_key, settings.secret_key}
    known |= set(db.session.scalars(sa.select(Credential.token_hash).where(Credential.node_id == node_id)))
    known |= set(db.session.scalars(sa.select(Enrollment.token_hash).where(Enrollment.node_id == node_id)))
    return {secret for secret in known if secret}


def scrub(value: object, known: set[str], path: str = "", findings: list[str] | None = None) -> object:
    """The value with secret-looking fields and secret values replaced by REMOVED; each found path appended."""
    findings = [] if findings is None else findings
    if isinstance(value, dict):
        cleaned = {}
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if secret_looking_name(str(key)) and item not in (None, "", [], {}):
                findings.append(where)
                cleaned[key] = REMOVED
            else:
                cleaned[key] = scrub(item, known, where, findings)
        return cleaned
    if isinstance(value, list):
        return [scrub(item, known, f"{path}[{index}]", findings) for index, item in enumerate(value)]
    if isinstance(value, str) and (redaction.looks_secret(value) or any(secret in value for secret in known)):
        findings.append(path or "(value)")
        return REMOVED
    return value


def scrub_evidence(document: dict[str, object], node_id: str) -> tuple[dict[str, object], list[str]]:
    """Evidence about a node (its read-back, a pasted inspect's projection) without anything secret.

    Removed: the node's known secrets, anything of app.redaction's shapes (ModelForge, Hub and
    provider tokens, a URL's password), secret-named fields; the paths where something was found
    are returned too ([] when clean).
    """
    findings: list[str] = []
    cleaned = scrub(document, _known_secrets(node_id), "", findings)
    return cleaned, findings
