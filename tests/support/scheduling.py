"""Helpers for the subagent, cron and heartbeat tests: private stacks with spawn and cron allowed,
a gateway client for them, and database look-ups."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

from sqlmodel import Session, col, select

from shared.agent import conversations
from shared.db import session_scope
from shared.models import TERMINAL, Conversation, CronJob, CronReceipt, Message, Run, RunKind, RunStatus, ToolCall
from shared.tools.base import ToolContext
from tests.support import services
from tests.support.processes import wait_until
from tests.support.stack import Stack, api_client

ALLOWED = ["time", "record", "sleepy", "spawn", "cron"]
FAST = {
    "TOOLS__ALLOWED": json.dumps(ALLOWED),
    "SCHEDULER__RECONCILE_INTERVAL": "1",
    "SCHEDULER__BEAT_LOCK_TIMEOUT": "3",
}
# Telegram configured, so jobs may target it; its API is a closed port: sends fail and stay in the outbox
TELEGRAM = {
    "CHANNELS__TELEGRAM__TOKEN": "123456:test-bot-token",
    "CHANNELS__TELEGRAM__WEBHOOK_SECRET": "tg-webhook-secret",
    "CHANNELS__TELEGRAM__API_BASE": "http://127.0.0.1:9",
}


@contextmanager
def claimed_redis_db(server: str) -> Iterator[str]:
    """One more Redis database reserved for this test session (the scheduling tests' shared worker)."""
    with services.claimed_redis_dbs(server, 1) as (n,):
        yield f"{server}/{n}"


def scheduling_stack(make_stack: Callable[..., Stack], *, worker: bool = True, beat: bool = False,
                     **extra: Any) -> Stack:
    """A private stack with spawn and cron allowed and quick reconciliation; a worker, maybe beat
    (started first: it comes up while the worker does). Worker and beat are procs[0] and procs[1]."""
    stack = make_stack(**{**FAST, **extra})
    beat_proc = stack.beat() if beat else None
    if worker:
        stack.worker(concurrency=16)
    if beat_proc is not None:
        stack.procs.reverse()
    return stack


@contextmanager
def client(stack: Stack) -> Iterator[Any]:
    """The gateway, in-process, for this stack."""
    gen: Generator[Any, None, None] = api_client(stack.settings)  # type: ignore[assignment]
    try:
        yield next(gen)
    finally:
        gen.close()


@contextmanager
def db(stack: Stack) -> Iterator[Session]:
    with session_scope(stack.settings.database_url) as s:
        yield s


def new_conversation(api: Any) -> str:
    r = api.post("/api/v1/conversations")
    assert r.status_code == 200, r.text
    return str(r.json()["conversationId"])


def parent_call(stack: Stack, name: str) -> ToolContext:
    """A turn whose step 1 journals a call of `name`, and the context that call runs with."""
    with db(stack) as s:
        conv = conversations.get_or_create(s, session_key="api:p", chat_id="p")
        origin = {"channel": "api", "chat_id": conv.id}
        run_id = conversations.try_start_turn(s, conv.id, origin=origin, lease_seconds=2)
        assert run_id is not None
        s.add(ToolCall(run_id=run_id, step_seq=1, call_id="call_1", name=name))
        return ToolContext(settings=stack.settings, run_id=run_id, conversation_id=conv.id, channel="api",
                           chat_id=conv.id, call_id="call_1", extra={"origin": origin})


def call(name: str, **args: Any) -> str:
    """A line that makes the fake LLM call a tool."""
    return f"call:{name} {json.dumps(args)}"


def runs(stack: Stack, **where: Any) -> list[Run]:
    with db(stack) as s:
        query = select(Run).order_by(col(Run.created_at))
        for name, value in where.items():
            query = query.where(getattr(Run, name) == value)
        return list(s.exec(query))


def subagents(stack: Stack) -> list[Run]:
    return runs(stack, kind=RunKind.SUBAGENT)


def reports(stack: Stack, conversation_id: str) -> list[Message]:
    """Subagent announcements written into a conversation."""
    with db(stack) as s:
        return list(s.exec(select(Message).where(Message.conversation_id == conversation_id,
                                                 col(Message.meta)["kind"].astext == "subagent_report")))


def settled(stack: Stack, conversation_id: str) -> bool:
    """No run of the conversation is still going and no message waits in its mailbox."""
    with db(stack) as s:
        conv = s.get_one(Conversation, conversation_id)
        waiting = s.exec(select(Message.id).where(Message.conversation_id == conversation_id,
                                                  col(Message.pending).is_(True))).first()
        going = [r for r in s.exec(select(Run).where(Run.conversation_id == conversation_id))
                 if r.status not in TERMINAL]
        return conv.active_run_id is None and waiting is None and not going


def wait_run(stack: Stack, run_id: str, timeout: float = 60) -> Run:
    def ended() -> Run | None:
        with db(stack) as s:
            run = s.get(Run, run_id)
            return run if run is not None and run.status in TERMINAL else None

    return wait_until(ended, timeout=timeout, message=f"run {run_id} to end")  # type: ignore[return-value]


def receipts(stack: Stack, job_id: str) -> list[CronReceipt]:
    with db(stack) as s:
        return list(s.exec(select(CronReceipt).where(CronReceipt.job_id == job_id)
                           .order_by(col(CronReceipt.scheduled_for))))


def job(stack: Stack, job_id: str) -> CronJob | None:
    with db(stack) as s:
        return s.get(CronJob, job_id)


def spawn(api: Any, cid: str, *tasks: str) -> list[dict[str, Any]]:
    """One turn whose model spawns a subagent per task; returns the spawn calls as the API shows them."""
    lines = "\n".join(call("spawn", task=t, label=f"job{i}") for i, t in enumerate(tasks))
    lines = lines.replace("sleep:", "sleep\\u003a")  # the child's delay, not the parent's (JSON-escaped ':')
    r = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": lines})
    assert r.status_code == 200, r.text
    return [c for c in r.json()["toolCalls"] if c["toolName"] == "spawn"]


def child_of(spawned: dict[str, Any]) -> str:
    assert spawned["status"] == "SUCCESS", spawned
    return str(json.loads(spawned["result"])["subagent_id"])


def reported(stack: Stack, cid: str, child_id: str) -> bool:
    child = next(r for r in subagents(stack) if r.id == child_id)
    return child.status in (RunStatus.SUCCEEDED, RunStatus.FAILED) and child.announced and settled(stack, cid)


def assert_reported_once(stack: Stack, cid: str, child_id: str, tag: str) -> None:
    child = next(r for r in subagents(stack) if r.id == child_id)
    assert child.status == RunStatus.SUCCEEDED
    assert child.final_text == f"done: recorded {tag}"
    assert [line.split()[-1] for line in stack.executions()].count(tag) == 1  # the tool ran exactly once
    [report] = reports(stack, cid)
    assert report.meta["subagent_run_id"] == child_id
    turns = runs(stack, conversation_id=cid)
    assert len(turns) == 2  # the spawning turn, and the one that told the user
    assert turns[1].status == RunStatus.SUCCEEDED
    assert f"done: recorded {tag}" in (turns[1].final_text or "")
