"""Celery signal handlers: logging set-up and the request id carried in task headers."""

from __future__ import annotations

from typing import Any

from celery import Task
from celery.signals import setup_logging, task_postrun, task_prerun, worker_init

from shared.constants import REQUEST_ID_HEADER
from shared.logs import configure_logging, request_id_var
from shared.settings import get_settings


def _setup_logging(**_: Any) -> None:
    settings = get_settings()
    configure_logging(level=settings.log_level, json=settings.log_json, secrets=settings.secrets())


def _prerun(task: Task | None = None, **_: Any) -> None:
    request_id = getattr(task.request, REQUEST_ID_HEADER, None) if task else None
    request_id_var.set(request_id)


def _postrun(**_: Any) -> None:
    request_id_var.set(None)


def _warm(**_: Any) -> None:
    """Before this worker takes its first task, so a restart does not slow the first turn by a second."""
    from shared.llm import LLMClient

    LLMClient(get_settings().llm).warm()


def connect() -> None:
    setup_logging.connect(_setup_logging, weak=False)
    task_prerun.connect(_prerun, weak=False)
    task_postrun.connect(_postrun, weak=False)
    worker_init.connect(_warm, weak=False)
