"""Small error classes that carry data and print well."""

from __future__ import annotations


class NanofleetError(Exception):
    """Base for errors the gateway maps to HTTP answers."""

    status_code = 400

    def __init__(self, message: str, **data: object) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class NotFound(NanofleetError):
    status_code = 404


class Conflict(NanofleetError):
    status_code = 409


class Retryable(Exception):
    """A transient failure: the task should run again after `delay` seconds (None: backoff)."""

    def __init__(self, message: str, *, delay: float | None = None, max_retries: int | None = None) -> None:
        super().__init__(message)
        self.delay = delay
        self.max_retries = max_retries
