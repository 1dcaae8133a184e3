"""Celery configuration shared by the worker app and the gateway's producer, and enqueue helpers."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from shared import broker
from shared.constants import (
    QUEUES,
    REDBEAT_PREFIX,
    REQUEST_ID_HEADER,
    T_AGENT_STEP,
    T_COMPACT,
    T_CRON_RECONCILE,
    T_DAILY_SUMMARY,
    T_HEARTBEAT,
    T_INGEST,
    T_RETENTION,
    T_SUBAGENT_STEP,
    T_SWEEP,
    T_TOOL_EXECUTE,
    TASK_ROUTES,
)
from shared.logs import request_id_var
from shared.settings import Settings, SettingsError

log = logging.getLogger(__name__)
VISIBILITY_TIMEOUT = 3600  # seconds; every task finishes far sooner (see the time limits)
# Celery's time limits, which only a prefork pool enforces (compose's tools worker): a backstop for
# a task stuck past its own timeouts. A step that calls the model or a tool gets what that call may
# take at most plus MARGIN, or the pool would cut short what the settings allow (a 600 s exec).
SOFT_TIME_LIMIT = 300
HARD_TIME_LIMIT = 330
MARGIN = 30


def celery_config(settings: Settings) -> dict[str, Any]:
    """Everything the app needs: explicit queues, routes, acks late, redbeat."""
    exchange = Exchange("nanofleet", type="direct")
    return {
        **broker.redis_config(settings.redis_url),  # broker, result backend and redbeat: URLs and TLS
        "task_ignore_result": True,
        "result_expires": 600,
        "task_queues": [Queue(q, exchange, routing_key=q) for q in QUEUES],
        "task_routes": TASK_ROUTES,
        "task_default_queue": QUEUES[0],
        "task_default_exchange": "nanofleet",
        "task_create_missing_queues": False,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_soft_time_limit": SOFT_TIME_LIMIT,
        "task_time_limit": HARD_TIME_LIMIT,
        "task_annotations": time_limits(settings),
        "broker_transport_options": {
            "visibility_timeout": VISIBILITY_TIMEOUT,
            "max_connections": 200,
            "socket_keepalive": True,
        },
        "result_backend_transport_options": {"max_connections": 50},
        "broker_connection_retry_on_startup": True,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Task events only while a monitor asks: Flower broadcasts enable_events every 5 s while it runs.
        # Unwatched, each task's three events (received, started, succeeded) cost it as many Redis
        # publishes, about a millisecond of a queue hop. Worker events (heartbeats) are always sent.
        "worker_send_task_events": False,
        # Flower follows each task from its receipt by a worker (queue depths: `nanofleet status`, Flower's
        # broker view); a "sent" event too would cost every enqueue another Redis publish (~0.8 ms).
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "beat_scheduler": "workers.beat:Scheduler",
        "redbeat_key_prefix": REDBEAT_PREFIX,
        # Its own (none): redbeat passes the broker's transport options to no client, and says each
        # time it reads them that it will stop reading them.
        "redbeat_redis_options": {},
        "redbeat_lock_timeout": settings.scheduler.beat_lock_timeout,
        "beat_max_loop_interval": 1,
        "beat_schedule": beat_schedule(settings),
        "timezone": "UTC",
        "enable_utc": True,
    }


def time_limits(settings: Settings) -> dict[str, dict[str, float]]:
    """Time limits of the tasks that may run longer than the default ones, by task name."""
    tools = settings.tools
    tool = max(tools.default_timeout, tools.exec.max_timeout, *(m.timeout for m in tools.mcp_servers.values()),
               *plugin_timeouts(settings))
    model = settings.llm.longest()

    def above(seconds: float) -> dict[str, float]:
        soft = max(SOFT_TIME_LIMIT, seconds + MARGIN)
        return {"soft_time_limit": soft, "time_limit": soft + HARD_TIME_LIMIT - SOFT_TIME_LIMIT}

    calls_the_model = (T_AGENT_STEP, T_SUBAGENT_STEP, T_COMPACT, T_HEARTBEAT, T_DAILY_SUMMARY, T_INGEST)  # voice
    return {T_TOOL_EXECUTE: above(tool), **{task: above(model) for task in calls_the_model}}


def plugin_timeouts(settings: Settings) -> list[float]:
    """The timeouts the plugin tools declare. Every process builds its Celery app, beat and `nanofleet
    status` too, which run no tool: a plugin that does not load is logged here, naming it, and left
    out; a worker refuses to start on it (workers/signals.py), as the gateway does."""
    if not settings.tools.plugins:  # importing the tools takes seconds (litellm), which status and beat need not
        return []
    from shared.tools import load_plugin  # the tools import this module

    timeouts = []
    for spec in settings.tools.plugins:
        try:
            timeouts.append(load_plugin(spec).timeout or 0.0)
        except SettingsError as err:
            log.error("%s (left out of the task time limits here)", err)
    return timeouts


def beat_schedule(settings: Settings) -> dict[str, Any]:
    """Beat's static entries; redbeat writes them at every start (and drops ones no longer here)."""
    def every(task: str, seconds: float) -> dict[str, Any]:
        return {"task": task, "schedule": timedelta(seconds=seconds), "options": {"expires": max(5.0, seconds * 5)}}

    schedule = {
        "nanofleet-sweep": every(T_SWEEP, settings.runtime.sweep_interval),
        "nanofleet-cron-reconcile": every(T_CRON_RECONCILE, settings.scheduler.reconcile_interval),
    }
    if settings.heartbeat.enabled:
        schedule["nanofleet-heartbeat"] = every(T_HEARTBEAT, settings.heartbeat.interval)
    if settings.retention.days > 0 or settings.channels.save_files_days > 0:
        schedule["nanofleet-retention"] = every(T_RETENTION, settings.retention.interval)
    return schedule


def make_celery(settings: Settings, *, name: str = "nanofleet", include: list[str] | None = None) -> Celery:
    """A Celery app configured for nanofleet (the worker's, or a bare producer)."""
    app = Celery(name, include=include or [])
    app.conf.update(celery_config(settings))
    return app


class Producer:
    """Sends tasks by name, with the current request id in the headers."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def send(self, task_name: str, *args: Any, countdown: float | None = None, **kwargs: Any) -> str:
        headers = {REQUEST_ID_HEADER: request_id_var.get()}
        # ignore_result: nothing waits on these results. Without it, Celery subscribes to each task's
        # result channel in a process that is not a worker (the gateway): two more Redis round trips a
        # send, and with Redis down a 19 s retry of the result store before the send fails.
        # declare=[]: a task goes straight to its queue's list (Celery publishes to a direct queue through
        # the default exchange, which needs no binding); declaring it again copied the queue every send.
        result = self.app.send_task(
            task_name, args=args, kwargs=kwargs, headers=headers, countdown=countdown, ignore_result=True,
            declare=[],
        )
        return str(result.id)
