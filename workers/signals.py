"""Celery signal handlers: logging set-up, the request id carried in task headers, start-up checks
and warm-up, and closing the MCP sessions at shutdown."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from celery.signals import (
    celeryd_after_setup,
    setup_logging,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_shutdown,
    worker_shutdown,
)
from celery.worker import WorkController
from sqlalchemy import text

from shared.constants import MODEL_QUEUES, REQUEST_ID_HEADER
from shared.logs import configure_logging, request_id_var
from shared.settings import Settings, get_settings
from workers import health

log = logging.getLogger(__name__)


def _setup_logging(**_: Any) -> None:
    settings = get_settings()
    configure_logging(level=settings.log_level, json=settings.log_json, secrets=settings.secrets())


def _prerun(task: Task | None = None, **_: Any) -> None:
    request_id = getattr(task.request, REQUEST_ID_HEADER, None) if task else None
    request_id_var.set(request_id)


def _postrun(**_: Any) -> None:
    request_id_var.set(None)


def _guard(**_: Any) -> None:
    """Before any task, and before a prefork pool forks: exec's commands cannot read the worker's secrets."""
    from shared.process_guard import guard_or_warn

    guard_or_warn("the worker")


def _check_plugins(**_: Any) -> None:
    """A worker whose tool plugins do not load would fail every step that builds its runtime: it
    refuses to start instead, naming the plugin (beat and `nanofleet status` go on without it)."""
    from shared.settings import SettingsError
    from shared.tools import check_plugins

    try:
        check_plugins(get_settings())
    except SettingsError as err:
        # SystemExit: Celery logs and swallows an Exception from a signal handler. Its message goes to stderr.
        raise SystemExit(f"nanofleet: the worker cannot start: {err}") from None


def _warm(instance: WorkController, **_: Any) -> None:
    """Once logging is set up and before this worker takes its first task, so that a restart does
    not slow the first turn by a second: litellm where this worker's queues call the model (the
    others never load it), and the database driver (about 0.15 s on first use). The connection is
    closed again, so a prefork pool forks none (each child opens its own)."""
    from shared.db import get_engine
    from shared.llm import LLMClient
    from shared.startup_checks import warn_model_key

    settings = get_settings()
    _warn(settings)
    if set(instance.app.amqp.queues.consume_from) & set(MODEL_QUEUES):
        warn_model_key(settings)
        LLMClient(settings.llm).warm()
    engine = get_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    except Exception as err:  # the first task reports a database that is down, and is retried
        log.warning("database warm-up failed: %s", err)
    engine.dispose()


def _warn(settings: Settings) -> None:
    """The settings that look like mistakes, at start (as every process says them), not at the first
    task, which builds the tool registry: an idle worker never said them."""
    from shared import startup_checks
    from shared.tools import builtin_tools, plugin_tools

    names = [t.name for t in (*builtin_tools(settings), *plugin_tools(settings))]  # MCP tools come later
    startup_checks.warn(settings, names, at_start=True)


def _close_mcp(**_: Any) -> None:
    """Stop the MCP servers this process started: a stdio server runs in a session of its own, and one
    that does not exit when its stdin closes would outlive the worker. They live where the tasks run:
    the worker's own process with a threads or solo pool (worker_shutdown, after the pool stopped),
    each child of a prefork pool (worker_process_shutdown, as it exits); elsewhere there are none."""
    from shared.tools import mcp

    try:
        mcp.shutdown()
    except Exception:  # the worker is stopping either way
        log.exception("closing the MCP sessions failed")


def connect() -> None:
    health.connect()
    setup_logging.connect(_setup_logging, weak=False)
    task_prerun.connect(_prerun, weak=False)
    task_postrun.connect(_postrun, weak=False)
    worker_init.connect(_guard, weak=False)
    worker_init.connect(_check_plugins, weak=False)
    celeryd_after_setup.connect(_warm, weak=False)
    worker_shutdown.connect(_close_mcp, weak=False)
    worker_process_shutdown.connect(_close_mcp, weak=False)
