"""A task through a real worker process, with the request id in the worker's log. (Producer sends
ignore results, as nothing in nanofleet waits on one: the worker's log shows the task ran.)"""

from __future__ import annotations

import json

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
