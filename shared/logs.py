"""Structured logging: JSON lines, a request id that follows the work, secrets redacted, and the
per-second recovery sweep's task lines at DEBUG."""

from __future__ import annotations

import json
import logging
import random
import sys
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from shared.constants import T_SWEEP

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)
REDACTED = "***"
# Attributes other libraries put on records that mean nothing in a log line: uvicorn's copy of the
# message with terminal colours, litellm's "already redacted" marker (a bare object()).
NOT_FIELDS = ("color_message", "litellm_redacted")
# Tasks beat sends so often (the sweep: every second) that Celery's INFO lines about them would be
# most of an idle system's log; they go out at DEBUG. What a sweep does, it logs itself.
QUIET_TASKS = (T_SWEEP,)


def new_request_id() -> str:
    """16 hex digits; it needs to be unique, not unguessable (uuid4 reads the kernel's randomness each time)."""
    return f"{random.getrandbits(64):016x}"


class ContextFilter(logging.Filter):
    """Adds the current request id to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id") or record.request_id is None:
            record.request_id = request_id_var.get()
        return True


class QuietTasks(logging.Filter):
    """Demotes Celery's INFO lines about the quiet tasks (beat's "Sending due task", the worker's
    "received", "succeeded", "Discarding revoked task") to DEBUG, and drops them unless DEBUG is on.
    Their warnings and errors, and every other task's lines, pass unchanged."""

    def __init__(self, tasks: Iterable[str]) -> None:
        super().__init__()
        self.tasks = frozenset(tasks)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not record.name.startswith("celery.") or not self._quiet(record.args):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)

    def _quiet(self, args: object) -> bool:
        """Celery passes the task's name among the arguments: a tuple (beat: entry, task name), or
        the one dict of the worker's task lines (its "name")."""
        values = args.values() if isinstance(args, Mapping) else args if isinstance(args, tuple) else ()
        return any(isinstance(v, str) and v in self.tasks for v in values)


class CleanJsonFormatter(JsonFormatter):
    """JSON lines without extras that carry nothing readable: the NOT_FIELDS, and any value that
    would print only as `<object object at 0x...>`."""

    def __init__(self, fmt: str, **kwargs: Any) -> None:
        super().__init__(fmt, reserved_attrs=[*RESERVED_ATTRS, *NOT_FIELDS], **kwargs)

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in log_data.items() if _readable(v)}


def _readable(value: object) -> bool:
    kind = type(value)
    return kind.__repr__ is not object.__repr__ or kind.__str__ is not object.__str__


class RedactingFormatter(logging.Formatter):
    """Masks every known secret in the finished line, extras and tracebacks included."""

    def __init__(self, inner: logging.Formatter, secrets: Iterable[str]) -> None:
        super().__init__()
        self.inner = inner
        # as written, and as a JSON line writes it: a secret with a quote, a backslash or a letter
        # outside ASCII is escaped there, and the plain form would not match
        forms = {f for s in secrets if s for f in (s, json.dumps(s)[1:-1], json.dumps(s, ensure_ascii=False)[1:-1])}
        self.secrets = sorted(forms, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        return self.redact(self.inner.format(record))

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text


def configure_logging(*, level: str = "INFO", json: bool = True, secrets: Iterable[str] = (),
                      quiet_tasks: Iterable[str] = QUIET_TASKS) -> None:
    """Route every logger through one handler with the context filter and the quiet tasks' filter."""
    handler = logging.StreamHandler(sys.stderr)
    inner: logging.Formatter
    if json:
        inner = CleanJsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s",
            rename_fields={"levelname": "level", "asctime": "time"},
        )
    else:
        inner = logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")
    handler.setFormatter(RedactingFormatter(inner, secrets))
    handler.addFilter(ContextFilter())
    handler.addFilter(QuietTasks(quiet_tasks))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpx2", "httpcore", "LiteLLM", "litellm"):  # httpx2: the MCP SDK's client
        logging.getLogger(noisy).setLevel(logging.WARNING)
