"""Waiting for runs: follow the conversation's event stream, confirm in Postgres."""

from __future__ import annotations

import asyncio
import signal
import time

import redis
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from gateway.state import AppState
from shared.agent import events
from shared.agent.events import stream_key
from shared.db import get_engine
from shared.errors import NanofleetError
from shared.models import TERMINAL, Message, Run


class NoAnswer(NanofleetError):
    """The wait ran out, or the gateway is shutting down; the run goes on. Carries `conversationId`
    and `runId` (None while the message waits for the conversation's current run to end)."""

    status_code = 504


def server_stopping() -> bool:
    """Whether the uvicorn server running this app has begun to shut down (SIGTERM, Ctrl-C). It
    then waits for open requests, so a waiter answers now instead of being cut off at the end of
    the grace period. Uvicorn's signal handler is a method of its server (sse-starlette finds it
    so too); under anything else this is False."""
    server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return bool(getattr(server, "should_exit", False))


async def last_event_id(state: AppState, conversation_id: str) -> str:
    """The newest event id now, so a waiter misses nothing published after this point."""
    newest = await state.aredis.xrevrange(stream_key(conversation_id), count=1)
    return str(newest[0][0]) if newest else "0-0"


def _run_for(state: AppState, message_id: int, run_id: str | None) -> Run | None:
    with Session(get_engine(state.settings.database_url)) as s:
        if run_id is None:
            msg = s.get(Message, message_id)
            run_id = msg.run_id if msg else None
        return s.get(Run, run_id) if run_id else None


async def wait_for_run(
    state: AppState, *, conversation_id: str, message_id: int, run_id: str | None, since: str, timeout: float
) -> Run:
    """The run that answered the message, once it has ended; NoAnswer on timeout."""
    deadline = time.monotonic() + timeout
    check = True
    while True:
        if check:
            run = await run_in_threadpool(_run_for, state, message_id, run_id)
            if run is not None:
                run_id = run.id
                if run.status in TERMINAL:
                    return run
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _no_answer(conversation_id, run_id, f"no answer within {timeout:g}s")
        if server_stopping():  # a 504 too, not a 503: that one says nothing was sent, and invites a retry
            raise _no_answer(conversation_id, run_id, "this gateway is shutting down")
        try:
            batch = await events.read(state.aredis, conversation_id, since, int(min(remaining, 1.0) * 1000) or 1)
        except redis.ConnectionError:  # Redis down or every connection in use: Postgres alone still tells the end
            await asyncio.sleep(min(remaining, 1.0))
            batch = []
        check = not batch  # confirm against Postgres on a final event, or every second
        for entry_id, fields in batch:
            since = entry_id
            check = check or fields.get("event") in events.FINAL


def _no_answer(conversation_id: str, run_id: str | None, why: str) -> NoAnswer:
    if run_id is None:
        where = (f"the message waits for the conversation's current run to end: "
                 f"poll GET /api/v1/conversations/{conversation_id}/messages")
    else:
        where = f"the run goes on: poll GET /api/v1/runs/{run_id} for its status and result"
    return NoAnswer(f"{why}; {where}", conversationId=conversation_id, runId=run_id)
