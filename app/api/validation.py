"""Request bodies: strict JSON parsing and field-by-field checks that name the field (A5)."""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any

from flask import request

from app.api.errors import ApiError
from app.enrollment import LABEL_KEY, MAX_LABEL_VALUE_LENGTH, MAX_LABELS

_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def json_object() -> dict[str, Any]:
    """The request body as a JSON object, or a 4xx naming what is wrong with it."""
    if request.mimetype != "application/json":
        raise ApiError(
            415,
            "UNSUPPORTED_MEDIA_TYPE",
            f"Expected Content-Type application/json, got {request.mimetype or 'none'}.",
            "Send the body as JSON with Content-Type: application/json.",
        )
    raw = request.get_data(cache=False)
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ApiError(
            400, "MALFORMED_JSON", "The request body is not valid UTF-8 JSON.", "Send a JSON object."
        ) from None
    if not isinstance(body, dict):
        raise ApiError(400, "BODY_NOT_OBJECT", "The request body must be a JSON object.", "Send a JSON object.")
    return body


def invalid(field: str, message: str) -> ApiError:
    """A 400 that names the offending field."""
    return ApiError(
        400,
        "VALIDATION_FAILED",
        f"{field}: {message}",
        f"Fix {field} and send the request again.",
        field=field,
    )


class Fields:
    """Typed access to a JSON object's fields, each failure naming the field by its path."""

    def __init__(self, data: dict[str, Any], path: str = "") -> None:
        self.data = data
        self.path = path

    def name(self, key: str) -> str:
        """The dotted path of a field, for messages."""
        return f"{self.path}{key}"

    def _get(self, key: str, required: bool) -> Any:
        value = self.data.get(key)
        if value is None and required:
            raise invalid(self.name(key), "is required")
        return value

    def reject_unknown(self, allowed: set[str]) -> None:
        """Refuse fields the endpoint does not know, so a typo is not silently ignored."""
        unknown = sorted(set(self.data) - allowed)
        if unknown:
            raise invalid(self.name(unknown[0]), "is not a known field")

    def string(self, key: str, *, required: bool = True, max_length: int = 200) -> str | None:
        """A non-empty string of at most `max_length` characters, without control characters."""
        value = self._get(key, required)
        if value is None:
            return None
        if not isinstance(value, str):
            raise invalid(self.name(key), "must be a string")
        value = value.strip()
        if not value:
            if required:
                raise invalid(self.name(key), "must not be empty")
            return None
        if len(value) > max_length:
            raise invalid(self.name(key), f"must be at most {max_length} characters")
        if _CONTROL_CHARS.search(value):
            raise invalid(self.name(key), "must not contain control characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate such as "\ud800" from a JSON escape
            raise invalid(self.name(key), "must be valid Unicode text") from None
        return value

    def integer(self, key: str, *, required: bool = True, minimum: int, maximum: int) -> int | None:
        """A whole number within bounds (a JSON boolean is not one)."""
        value = self._get(key, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(self.name(key), "must be a whole number")
        if not minimum <= value <= maximum:
            raise invalid(self.name(key), f"must be between {minimum} and {maximum}")
        return value

    def number(self, key: str, *, minimum: float, maximum: float) -> float | None:
        """An optional finite number within bounds; null means NVML could not read it (P3)."""
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise invalid(self.name(key), "must be a number or null")
        if isinstance(value, int) and abs(value) > 2**53:
            raise invalid(self.name(key), f"must be between {minimum} and {maximum}")
        if not math.isfinite(value):
            raise invalid(self.name(key), "must be a number or null")
        if not minimum <= value <= maximum:
            raise invalid(self.name(key), f"must be between {minimum} and {maximum}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        """An optional JSON boolean."""
        if key not in self.data:
            return default
        value = self.data[key]
        if not isinstance(value, bool):
            raise invalid(self.name(key), "must be true or false")
        return value

    def uuid(self, key: str) -> str:
        """A UUID in canonical lower-case form."""
        value = self.string(key, max_length=36)
        try:
            return str(uuid.UUID(value))
        except ValueError:
            raise invalid(self.name(key), "must be a UUID") from None

    def obj(self, key: str, *, required: bool = True) -> Fields | None:
        """A nested object, as Fields."""
        value = self._get(key, required)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise invalid(self.name(key), "must be an object")
        return Fields(value, f"{self.name(key)}.")

    def array(self, key: str, *, max_items: int, required: bool = True) -> list[Any]:
        """A list of at most `max_items` items."""
        if key not in self.data and not required:
            return []
        value = self._get(key, required)
        if not isinstance(value, list):
            raise invalid(self.name(key), "must be a list")
        if len(value) > max_items:
            raise invalid(self.name(key), f"must have at most {max_items} items")
        return value

    def item(self, key: str, index: int, value: Any) -> Fields:
        """The object at `key[index]`, as Fields."""
        if not isinstance(value, dict):
            raise invalid(f"{self.name(key)}[{index}]", "must be an object")
        return Fields(value, f"{self.name(key)}[{index}].")

    def labels(self, key: str) -> dict[str, str]:
        """A string→string map of at most 32 short labels."""
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise invalid(self.name(key), "must be an object of string values")
        if len(value) > MAX_LABELS:
            raise invalid(self.name(key), f"must have at most {MAX_LABELS} labels")
        for label, text in value.items():
            if not LABEL_KEY.match(label):
                raise invalid(f"{self.name(key)}.{label}", "label names are letters, digits, . _ / -")
            if not isinstance(text, str) or len(text) > MAX_LABEL_VALUE_LENGTH:
                raise invalid(
                    f"{self.name(key)}.{label}", f"must be a string of at most {MAX_LABEL_VALUE_LENGTH} characters"
                )
        return dict(value)
