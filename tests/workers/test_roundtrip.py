"""A task through a real worker process, with the request id in the worker's log. (Producer sends
ignore results, as nothing in nanofleet waits on one: the worker's log shows the task ran.)"""

from __future__ import annotations

import json
import threading
from typing import Any

from celery import Celery

from shared.constants import T_PING
from shared.logs import request_id_var
from shared.queueing import Producer, make_celery
from tests.support.processes import wait_until
from tests.support.stack import Stack


def test_task_round_trip_carries_the_request_id(stack: Stack) -> None:
    app = make_celery(stack.settings)
    token = request_id_var.set("req-roundtrip-42")
    try:
        Producer(app).send(T_PING, "hello")
    finally:
        request_id_var.reset(token)
    worker = next(p for p in stack.procs if p.alive())

    def logged() -> bool:
        for line in worker.log().splitlines():
            if line.startswith("{") and "ping hello" in line:
                record = json.loads(line)
                return bool(record.get("request_id") == "req-roundtrip-42")
        return False

    wait_until(logged, timeout=30, message="the worker's log line with the request id")


def test_secrets_never_reach_the_worker_log(stack: Stack) -> None:
    app = make_celery(stack.settings)
    secret = stack.settings.llm.api_key.get_secret_value()  # type: ignore[union-attr]
    Producer(app).send(T_PING, f"key={secret}")
    worker = next(p for p in stack.procs if p.alive())
    wait_until(lambda: "key=***" in worker.log(), timeout=30, message="the redacted log line")
    assert secret not in worker.log()


def test_task_events_flow_once_a_monitor_asks_for_them(stack: Stack) -> None:
    """A worker publishes no task events until a monitor asks (Flower broadcasts enable_events every
    5 s while it runs): unwatched, each would cost every task three Redis publishes. Its heartbeats
    (Flower's worker list, compose's healthcheck) go on regardless."""
    app = make_celery(stack.settings)
    seen: list[dict[str, Any]] = []
    with app.connection_for_read() as conn:
        receiver = app.events.Receiver(conn, handlers={"*": seen.append})
        listener = threading.Thread(target=receiver.capture, kwargs={"limit": None, "wakeup": False}, daemon=True)
        listener.start()
        try:
            _events_once_asked(stack, app, seen)
        finally:
            receiver.should_stop = True  # seen after the next event: heartbeats come every 2 s
            listener.join(10)


def _events_once_asked(stack: Stack, app: Celery, seen: list[dict[str, Any]]) -> None:
    wait_until(lambda: any(e["type"] == "worker-heartbeat" for e in seen), timeout=30,
               message="a worker heartbeat event")
    worker = next(p for p in stack.procs if p.alive())
    unwatched = Producer(app).send(T_PING, "unwatched")
    wait_until(lambda: "ping unwatched" in worker.log(), timeout=30, message="the unwatched task to run")
    replies = app.control.broadcast("enable_events", reply=True, timeout=5)
    assert replies and all("enabled" in str(r) for r in replies), replies
    watched = Producer(app).send(T_PING, "watched")
    wait_until(lambda: any(e.get("uuid") == watched and e["type"] == "task-succeeded" for e in seen), timeout=30,
               message="the watched task's task-succeeded event")
    assert {e["type"] for e in seen if e.get("uuid") == watched} >= {"task-received", "task-started"}
    assert not [e for e in seen if e.get("uuid") == unwatched]
