"""A worker outlives its broker: Redis is SIGKILLed while tool calls run, and comes back empty."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from bench.services import DedicatedRedis
from shared.db import get_engine
from tests.fakes.llm import FakeLLM
from tests.support.processes import wait_until
from tests.support.stack import Stack, api_client, clean_db, make_env

SLOW_TOOL = 'call:record {"tag": "during-outage", "seconds": 1.5}'


def _running_tools(database_url: str) -> int:
    with get_engine(database_url).connect() as conn:
        return int(conn.execute(text("select count(*) from tool_calls where status = 'RUNNING'")).scalar_one())


def test_a_worker_reconnects_after_the_broker_restarts(database_url: str, fake_llm: FakeLLM, tmp_path: Path) -> None:
    """Tasks that finish while Redis is down cannot be acknowledged; kombu's channel close then
    raised an AttributeError and the worker exited. It must reconnect and serve new turns."""
    clean_db(database_url)
    fake_llm.reset()
    broker = DedicatedRedis(tmp_path / "redis")
    broker.start()
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

            assert broker.proc is not None
            broker.proc.kill()  # SIGKILL: no goodbye to the clients
            broker.proc.wait(10)
            wait_until(lambda: _running_tools(database_url) == 0, timeout=30,
                       message="the tool calls to finish while the broker is down")
            broker.start()  # same port, empty

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
        broker.stop()
