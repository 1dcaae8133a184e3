"""Waiting for runs: follow the conversation's event stream, confirm in Postgres."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from gateway.state import REDIS_WAIT, AppState
from shared import db
from shared.agent import events
from shared.agent.events import stream_key
from shared.db import get_engine
from shared.errors import NanofleetError
from shared.models import TERMINAL, Message, Run

log = logging.getLogger(__name__)
T = TypeVar("T")
# A read of the event stream blocks up to a second; a Redis that accepts and never answers is given
# this much more before the wait goes on without it (its socket timeout, 30 s, would outlast the deadline).
READ_GRACE = 2.0
DB_RETRY = 1.0  # seconds between tries of a database read that failed while a chat waits
# Redis may fail this while a chat waits: refused, every connection busy, or a server that stopped answering.
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, TimeoutError)


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


async def promptly(command: Awaitable[T]) -> T:
    """A Redis command that is answered within REDIS_WAIT seconds, or redis.TimeoutError (which
    gateway/app.py answers with a 503): a server that stopped answering would hold the request
    for the client's whole read timeout (30 s, to outlast the event streams' blocking reads)."""
    try:
        return await asyncio.wait_for(command, REDIS_WAIT)
    except TimeoutError as err:
        raise redis.TimeoutError(f"Redis did not answer within {REDIS_WAIT:g}s") from err


async def last_event_id(state: AppState, conversation_id: str) -> str:
    """The newest event id now, so a waiter misses nothing published after this point."""
    newest = await promptly(state.aredis.xrevrange(stream_key(conversation_id), count=1))
    return str(newest[0][0]) if newest else "0-0"


async def read_retrying(read: Callable[[], T], *, until: float) -> T:
    """`read()` in the threadpool, tried again every DB_RETRY seconds while the database is
    unavailable, until `until` (time.monotonic()); then its error. A chat's message is stored by
    then: a 503 (which says nothing was sent) would invite a retry that sends it twice."""
    while True:
        try:
            return await run_in_threadpool(read)
        except Exception as err:
            if not db.unavailable(err) or time.monotonic() >= until:
                raise
            log.warning("the database is unavailable (%s) while a chat waits; trying again", type(err).__name__)
        await asyncio.sleep(max(0.0, min(DB_RETRY, until - time.monotonic())))


def _run_for(state: AppState, message_id: int, run_id: str | None) -> Run | None:
    with Session(get_engine(state.settings.database_url)) as s:
        if run_id is None:
            msg = s.get(Message, message_id)
            run_id = msg.run_id if msg else None
        return s.get(Run, run_id) if run_id else None


async def wait_for_run(
    state: AppState, *, conversation_id: str, message_id: int, run_id: str | None, since: str, timeout: float
) -> Run:
    """The run that answered the message, once it has ended; NoAnswer on timeout. The message is
    stored: Redis or Postgres failing meanwhile ends the wait only at its deadline, with a 504 too."""
    deadline = time.monotonic() + timeout
    check = True
    while True:
        failed = False
        if check:
            run, failed = await _try_run_for(state, message_id, run_id)
            if run is not None:
                run_id = run.id
                if run.status in TERMINAL:
                    return run
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _no_answer(conversation_id, run_id, f"no answer within {timeout:g}s")
        if server_stopping():  # a 504 too, not a 503: that one says nothing was sent, and invites a retry
            raise _no_answer(conversation_id, run_id, "this gateway is shutting down")
        block = min(remaining, 1.0)
        started = time.monotonic()
        try:
            batch = await asyncio.wait_for(
                events.read(state.aredis, conversation_id, since, int(block * 1000) or 1), block + READ_GRACE)
        except REDIS_DOWN:  # down, busy or not answering: Postgres alone still tells the end
            await asyncio.sleep(max(0.0, block - (time.monotonic() - started)))
            batch = []
        # confirm against Postgres on a final event, or every second (and after a read of it failed)
        check = not batch or failed
        for entry_id, fields in batch:
            since = entry_id
            check = check or fields.get("event") in events.FINAL


async def _try_run_for(state: AppState, message_id: int, run_id: str | None) -> tuple[Run | None, bool]:
    """The run (None while it is not known yet), and whether Postgres failed to say (asked again shortly)."""
    try:
        return await run_in_threadpool(_run_for, state, message_id, run_id), False
    except Exception as err:
        if not db.unavailable(err):
            raise
        log.warning("the database is unavailable (%s) while a chat waits; trying again", type(err).__name__)
        return None, True


def unread(conversation_id: str, run_id: str) -> NoAnswer:
    """The 504 of a chat whose ended run could not be read in time (the database unavailable)."""
    return NoAnswer(f"the run's result could not be read (the database is unavailable); poll GET "
                    f"/api/v1/runs/{run_id} for its status and result", conversationId=conversation_id, runId=run_id)


def _no_answer(conversation_id: str, run_id: str | None, why: str) -> NoAnswer:
    if run_id is None:
        where = (f"the message waits for the conversation's current run to end: "
                 f"poll GET /api/v1/conversations/{conversation_id}/messages")
    else:
        where = f"the run goes on: poll GET /api/v1/runs/{run_id} for its status and result"
    return NoAnswer(f"{why}; {where}", conversationId=conversation_id, runId=run_id)
