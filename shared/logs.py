"""Structured logging: JSON lines, a request id that follows the work, secrets redacted."""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterable
from contextvars import ContextVar

from pythonjsonlogger.json import JsonFormatter

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)
REDACTED = "***"


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


class ContextFilter(logging.Filter):
    """Adds the current request id to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id") or record.request_id is None:
            record.request_id = request_id_var.get()
        return True


class RedactingFormatter(logging.Formatter):
    """Masks every known secret in the finished line, extras and tracebacks included."""

    def __init__(self, inner: logging.Formatter, secrets: Iterable[str]) -> None:
        super().__init__()
        self.inner = inner
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        return self.redact(self.inner.format(record))

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text


def configure_logging(*, level: str = "INFO", json: bool = True, secrets: Iterable[str] = ()) -> None:
    """Route every logger through one handler with the context filter."""
    handler = logging.StreamHandler(sys.stderr)
    inner: logging.Formatter
    if json:
        inner = JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s",
            rename_fields={"levelname": "level", "asctime": "time"},
        )
    else:
        inner = logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")
    handler.setFormatter(RedactingFormatter(inner, secrets))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpx2", "httpcore", "LiteLLM", "litellm"):  # httpx2: the MCP SDK's client
        logging.getLogger(noisy).setLevel(logging.WARNING)
