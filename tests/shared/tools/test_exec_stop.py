"""exec and the end of its run: `/stop` kills a running command with all its processes, and the
call ends with an error that says so; a run that stays active, or a database that does not
answer, leaves the command alone. On real Postgres, with a real worker process for `/stop`."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import text

from shared.db import get_engine
from shared.models import Run
from shared.settings import load_settings
from shared.tools import build_registry
from shared.tools.base import ErrorCode, ToolResult
from tests.shared.tools.conftest import call
from tests.support.processes import wait_until
from tests.support.stack import Stack, api_client

SLEEP = 8  # seconds the command sleeps before it writes its file


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def never(predicate: Callable[[], bool], *, until: float, message: str) -> None:
    """Fail as soon as `predicate` holds, looking until the monotonic time `until`."""
    while time.monotonic() < until:
        assert not predicate(), message
        time.sleep(0.1)
    assert not predicate(), message


def started_shell(workspace: Path, timeout: float) -> tuple[int, float]:
    """The pid of the command's shell, once it wrote it to shell.pid, and the monotonic time then."""
    pid_file = workspace / "shell.pid"
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=timeout,
               message="the command to start")
    return int(pid_file.read_text()), time.monotonic()


def assert_killed_before_writing(workspace: Path, shell: int, started: float, file: str) -> None:
    """The shell is gone within a few seconds, and the file it was to write after its sleep never comes."""
    wait_until(partial(gone, shell), timeout=5, message=f"the command's shell {shell} to be killed")
    never((workspace / file).exists, until=started + SLEEP + 3, message="the stopped command wrote its file")


def ended_call(api: Any, run_id: str) -> dict[str, Any] | None:
    [c] = api.get(f"/api/v1/runs/{run_id}").json()["toolCalls"]
    return c if c["status"] != "RUNNING" else None


def test_stop_kills_a_running_command_and_says_so(make_stack: Callable[..., Stack], open_workspace: Path) -> None:
    s = make_stack(WORKSPACE=str(open_workspace), TOOLS__ALLOWED=json.dumps(["exec"]),
                   PERMISSIONS__GRANTED=json.dumps(["SHELL"]))
    s.worker()
    command = f"echo $$ > shell.pid; sleep {SLEEP}; echo done > stop_main.txt"
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        run_id = api.post(f"/api/v1/conversations/{cid}/messages", json={
            "message": f"call:exec {json.dumps({'command': command, 'timeout': 60})}"}).json()["runId"]
        shell, started = started_shell(open_workspace, timeout=60)
        assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/stop"}).json()[
            "assistantMessage"] == "Stopped 1 running task(s)."
        assert_killed_before_writing(open_workspace, shell, started, "stop_main.txt")
        result = wait_until(partial(ended_call, api, run_id), timeout=30, message="the call's result")
        assert isinstance(result, dict)
        assert (result["status"], result["errorCode"]) == ("FAILED", "FAILED")
        assert "stopped: the run was cancelled while this command ran" in result["result"]


def _settings(workspace: Path, database_url: str) -> Any:
    return load_settings(workspace=workspace, database_url=database_url,
                         tools={"allowed": ["exec"], "exec": {"run_as_user": ""}},
                         permissions={"granted": ["SHELL"]})


def test_a_command_of_an_active_run_runs_to_its_end(workspace: Path, database_url: str,
                                                    make_run: Callable[..., Run]) -> None:
    run = make_run()
    result = call(build_registry(_settings(workspace, database_url)), "exec",
                  {"command": "sleep 2.5; echo finished"}, run_id=run.id)
    assert result.ok and result.output == "finished\n[exit code: 0]"


def test_a_database_that_does_not_answer_leaves_the_command_running(workspace: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    unreachable = "postgresql+psycopg://postgres@127.0.0.1:1/nanofleet"  # nothing listens on port 1
    with caplog.at_level(logging.WARNING):
        result = call(build_registry(_settings(workspace, unreachable)), "exec",
                      {"command": "sleep 2.5; echo finished"}, run_id="r-unreachable")
    assert result.ok and result.output == "finished\n[exit code: 0]"
    assert any("r-unreachable" in r.getMessage() for r in caplog.records)


def test_a_run_cancelled_in_the_database_stops_its_command(workspace: Path, database_url: str,
                                                           make_run: Callable[..., Run]) -> None:
    """The status is what the command watches: whoever ends the run (a cancel, the sweeper giving up)."""
    run = make_run()
    outcome: list[ToolResult] = []
    command = f"echo $$ > shell.pid; sleep {SLEEP}; echo done > late.txt"
    worker = threading.Thread(target=lambda: outcome.append(call(
        build_registry(_settings(workspace, database_url)), "exec", {"command": command, "timeout": 60},
        run_id=run.id)))
    worker.start()
    shell, started = started_shell(workspace, timeout=30)
    with get_engine(database_url).begin() as conn:
        conn.execute(text("update runs set status = 'failed' where id = :id"), {"id": run.id})
    assert_killed_before_writing(workspace, shell, started, "late.txt")
    worker.join(timeout=30)
    [result] = outcome
    assert result.error == ErrorCode.FAILED and not result.retryable
    assert "stopped: the run failed while this command ran" in result.message
