"""A worker or gateway that stops stops the stdio MCP servers it started. A server runs in a session
of its own, so it gets no signal of the worker's; one that does not exit when its stdin closes (a
non-daemon thread, as some servers have) was left running, orphaned, at every restart. Real worker
and gateway processes, sent SIGTERM as a supervisor stops them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shared.constants import T_SWEEP
from shared.queueing import Producer, make_celery
from tests.support.processes import ROOT, Proc, wait_until
from tests.support.stack import Stack, gateway_process

# The demo server with a non-daemon thread: it outlives its stdin for two minutes
LINGERING = ("import threading, time; threading.Thread(target=time.sleep, args=(120,)).start(); "
             "from tests.support.mcp_server import main; main()")


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not: whoever adopted it may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.fixture
def lingering(make_stack: Callable[..., Stack], tmp_path: Path) -> Iterator[tuple[Stack, Callable[[], int]]]:
    """A stack whose one MCP server lingers, and a wait for that server's pid once it started. A server
    still running at the end is killed."""
    starts = tmp_path / "starts"
    server = {"command": sys.executable, "args": ["-c", LINGERING], "cwd": str(ROOT),
              "env": {"MCP_DEMO_STARTS": str(starts)}}
    stack = make_stack(TOOLS__MCP_SERVERS=json.dumps({"linger": server}))

    def pids() -> list[int]:
        return [int(pid) for pid in starts.read_text().split()] if starts.exists() else []

    def started() -> int:
        wait_until(pids, timeout=60, message="the MCP server to start")
        return pids()[0]

    yield stack, started
    for pid in pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stopped(proc: Proc, pid: int) -> None:
    """SIGTERM `proc` alone (as `docker stop` does), and see the server `pid` gone once it exited."""
    assert running(pid)
    os.kill(proc.pid, signal.SIGTERM)
    wait_until(lambda: not proc.alive(), timeout=60, message="the process to exit")
    wait_until(lambda: not running(pid), timeout=30, message="the MCP server to be stopped")


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_stopped_worker_stops_its_mcp_servers(lingering: tuple[Stack, Callable[[], int]], pool: str) -> None:
    """Threads: the sessions are the worker process's own; prefork: each child's."""
    stack, started = lingering
    worker = stack.worker(pool=pool, concurrency=1)
    Producer(make_celery(stack.settings)).send(T_SWEEP)  # the first task builds the runtime, which connects
    stopped(worker, started())


def test_a_stopped_gateway_stops_its_mcp_servers(lingering: tuple[Stack, Callable[[], int]]) -> None:
    stack, started = lingering
    with gateway_process(stack) as (gateway, _):
        stopped(gateway, started())
