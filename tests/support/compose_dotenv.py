"""Reading a .env file exactly as Docker Compose v2 does, for tests that have no Compose."""

from __future__ import annotations

import re


def read_compose_dotenv(text: str) -> dict[str, str]:
    """The .env as Docker Compose v2 reads it (compose-go dotenv/parser.go), for one-line values.

    Unquoted: up to " #", trailing space trimmed, then interpolated. Single quotes: literal up to the
    first quote not preceded by a backslash. Double quotes: the same end rule, then `\\\\`, `\\"`,
    `\\$` and the other escapes undone, then interpolated. Interpolation turns `$$` into `$`; any
    other `$` would substitute a variable, which the .env must never ask for, so it fails here.
    """
    values: dict[str, str] = {}
    for number, raw_line in enumerate(text.split("\n"), 1):
        line = raw_line.lstrip(" \t\v\f\r")
        if not line or line.startswith("#"):
            continue
        line = re.sub(r"^export\s+", "", line)
        key, separator, rest = line.partition("=")
        assert separator and re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+", key.rstrip()), f"line {number}: {raw_line!r}"
        values[key.rstrip()] = _compose_value(rest.lstrip(" \t\v\f\r\x85\xa0"), number)
    return values


def _compose_value(raw: str, number: int) -> str:
    if not raw or raw[0] not in "'\"":
        return _interpolate(raw.split(" #", 1)[0].rstrip())
    quote = raw[0]
    for end in range(1, len(raw)):
        if raw[end] != quote or raw[end - 1] == "\\":
            continue
        after = raw[end + 1 :].strip()
        assert not after or after.startswith("#"), f"line {number}: text after the closing quote"
        value = raw[1:end]
        return value if quote == "'" else _interpolate(_compose_escapes(value))
    raise AssertionError(f"line {number}: unterminated quoted value")


def _compose_escapes(value: str) -> str:
    simple = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", '"': '"', "\\": "\\"}

    def undo(match: re.Match) -> str:
        text = match.group(0)
        if text == "\\$":
            return "$$"
        if text[1] == "0":
            return chr(int(text[2:] or "0", 8))
        return simple.get(text[1], text)

    return re.sub(r"\\(?:[abcfnrtv$\"\\]|0\d{0,3})", undo, value)


def _interpolate(value: str) -> str:
    def undo(match: re.Match) -> str:
        assert match.group(0) == "$$", f"Compose would interpolate {match.group(0)!r}"
        return "$"

    return re.sub(r"\$\$|\$.?", undo, value)
