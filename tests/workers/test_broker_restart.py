"""A worker outlives its broker: Redis is SIGKILLed while tool calls run, and comes back empty; on a
TCP port (redis://) and on a unix socket (unix://, kombu's redis+socket)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest
import redis
from sqlalchemy import text

from bench.services import DedicatedRedis
from shared.db import get_engine
from tests.fakes.llm import FakeLLM
from tests.support.processes import wait_until
from tests.support.stack import Stack, api_client, clean_db, make_env

SLOW_TOOL = 'call:record {"tag": "during-outage", "seconds": 1.5}'


class Broker(Protocol):
    url: str

    def start(self) -> str: ...
    def kill(self) -> None: ...
    def stop(self) -> None: ...


class TcpRedis:
    """bench's DedicatedRedis: a redis-server on a fixed loopback port."""

    def __init__(self, root: Path) -> None:
        self.server = DedicatedRedis(root)
        self.url = self.server.url

    def start(self) -> str:
        return self.server.start()

    def kill(self) -> None:
        assert self.server.proc is not None
        self.server.proc.kill()  # SIGKILL: no goodbye to the clients
        self.server.proc.wait(10)

    def stop(self) -> None:
        self.server.stop()


class SocketRedis:
    """A redis-server on a unix socket only, at a fixed path (short: a socket's path has a length limit)."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="nf-sock-"))
        self.path = self.folder / "redis.sock"
        self.url = f"unix://{self.path}?db=2"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.skip("redis-server is not installed")
        self.proc = subprocess.Popen([exe, "--port", "0", "--unixsocket", str(self.path), "--unixsocketperm", "700",
                                      "--save", "", "--appendonly", "no", "--dir", str(self.folder)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, "redis-server exited"
            try:
                with redis.Redis(unix_socket_path=str(self.path), socket_timeout=1.0) as client:
                    return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(up, timeout=20, message="the socket redis-server to answer")
        return self.url

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(params=["tcp", "socket"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    server: Broker = TcpRedis(tmp_path / "redis") if request.param == "tcp" else SocketRedis()
    server.start()
    yield server
    server.stop()


def _running_tools(database_url: str) -> int:
    with get_engine(database_url).connect() as conn:
        return int(conn.execute(text("select count(*) from tool_calls where status = 'RUNNING'")).scalar_one())


def test_a_worker_reconnects_after_the_broker_restarts(database_url: str, fake_llm: FakeLLM, tmp_path: Path,
                                                       broker: Broker) -> None:
    """Tasks that finish while Redis is down cannot be acknowledged; kombu's channel close then
    raised an AttributeError and the worker exited. It must reconnect and serve new turns, on a
    socket as on a port."""
    clean_db(database_url)
    fake_llm.reset()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    stack = Stack(make_env(database_url=database_url, redis_url=broker.url, llm_url=fake_llm.url,
                           workspace=workspace), tmp_path)
    try:
        worker = stack.worker(concurrency=8)
        for client in api_client(stack.settings):
            for _ in range(4):
                cid = client.post("/api/v1/conversations").json()["conversationId"]
                posted = client.post(f"/api/v1/conversations/{cid}/messages", json={"message": SLOW_TOOL})
                assert posted.status_code == 202
            wait_until(lambda: _running_tools(database_url) == 4, timeout=30, message="four tool calls running")

            broker.kill()  # SIGKILL: no goodbye to the clients
            wait_until(lambda: _running_tools(database_url) == 0, timeout=30,
                       message="the tool calls to finish while the broker is down")
            broker.start()  # same port or socket, empty

            def reconnected() -> bool:
                assert worker.alive(), f"the worker exited:\n{worker.log()[-3000:]}"
                return "Connected to" in worker.log().split("Connection to broker lost")[-1]

            wait_until(reconnected, timeout=60, message="the worker to reconnect")
            cid = client.post("/api/v1/conversations").json()["conversationId"]
            reply = client.post(f"/api/v1/conversations/{cid}/chat", json={"message": "still there?"})
            assert reply.status_code == 200 and reply.json()["assistantMessage"] == "echo: still there?"
            assert worker.alive()
    finally:
        stack.stop()
