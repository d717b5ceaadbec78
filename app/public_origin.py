"""The API origin agents are told to use (E3), for the API and the console alike."""

from __future__ import annotations

from flask import request

from app.config import current_settings, normalize_origin


def current_api_origin() -> str:
    """E3: the origin agents must use — MODELFORGE_PUBLIC_API_ORIGIN, else this request's own."""
    return current_settings().public_api_origin or normalize_origin(request.host_url) or request.host_url
