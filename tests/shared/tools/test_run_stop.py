"""A tool call whose run ends while it works (`/stop`, a cancel, the sweeper giving up) is cancelled
within about a second, whatever the tool: a fetch no one waits for does not run to its timeout. A
call of an active run is left alone. On real Postgres (the run's status is what is watched); exec,
which watches its run itself, is in test_exec_stop.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import text

from shared.db import get_engine
from shared.models import Run
from shared.settings import load_settings
from shared.tools import build_registry
from shared.tools.base import ErrorCode, ToolResult
from shared.tools.registry import ToolRegistry
from tests.fakes.web import FakeWeb
from tests.shared.tools.conftest import call
from tests.support.processes import wait_until

SLOW = 20  # seconds the fake site takes to answer


def set_status(database_url: str, run: Run, status: str) -> None:
    with get_engine(database_url).begin() as conn:
        conn.execute(text("update runs set status = :status where id = :id"), {"status": status, "id": run.id})


def web_tools(workspace: Path, database_url: str, web: FakeWeb) -> ToolRegistry:
    """The built-in tools, the fake site reachable, watching the test database's runs."""
    return build_registry(load_settings(workspace=workspace, database_url=database_url, tools={
        "allowed": ["http_get"], "web": {"allow_hosts": [web.host], "http_timeout": 60}},
        permissions={"granted": ["NET_HTTP"]}))


def test_a_fetch_ends_when_its_run_is_cancelled(workspace: Path, web: FakeWeb, database_url: str,
                                               make_run: Callable[..., Run]) -> None:
    run = make_run()
    reg = web_tools(workspace, database_url, web)
    outcome: list[ToolResult] = []
    fetching = threading.Thread(target=lambda: outcome.append(
        call(reg, "http_get", {"url": f"{web.url}/slow?seconds={SLOW}"}, run_id=run.id)))
    asked = web.slow_requests
    fetching.start()
    wait_until(lambda: web.slow_requests > asked, timeout=10, message="the request to reach the site")
    cancelled_at = time.monotonic()
    set_status(database_url, run, "cancelled")
    wait_until(lambda: not fetching.is_alive(), timeout=SLOW / 2, message="the fetch to end with its run")
    [result] = outcome
    assert time.monotonic() - cancelled_at < SLOW / 2
    assert (result.error, result.retryable) == (ErrorCode.FAILED, False)
    assert result.message == "stopped: the run was cancelled while this call ran; it was cancelled"


def test_a_call_of_an_active_run_runs_to_its_end(workspace: Path, web: FakeWeb, database_url: str,
                                                 make_run: Callable[..., Run]) -> None:
    run = make_run()
    reg = web_tools(workspace, database_url, web)
    result = call(reg, "http_get", {"url": f"{web.url}/slow?seconds=2.5"}, run_id=run.id)
    assert result.ok and result.output["body"] == "finally", result
