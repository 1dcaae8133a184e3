"""Waiting for runs: follow the conversation's event stream, confirm in Postgres."""

from __future__ import annotations

import time

from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from gateway.state import AppState
from shared.agent import events
from shared.agent.events import stream_key
from shared.db import get_engine
from shared.models import TERMINAL, Message, Run


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
) -> Run | None:
    """The run that answered the message, once it has ended; None on timeout."""
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
            return None
        batch = await events.read(state.aredis, conversation_id, since, int(min(remaining, 1.0) * 1000) or 1)
        check = not batch  # confirm against Postgres on a final event, or every second
        for entry_id, fields in batch:
            since = entry_id
            check = check or fields.get("event") in events.FINAL
