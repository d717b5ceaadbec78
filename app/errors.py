"""Domain errors: a stable UPPER_SNAKE code, a message and a next step (P5). No HTTP here."""

from __future__ import annotations


class DomainError(Exception):
    """A refusal the caller can act on; app.web_errors maps `code` to an HTTP status."""

    def __init__(self, code: str, message: str, next_step: str, **extra: object) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.next_step = next_step
        self.extra = extra
