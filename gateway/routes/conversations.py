"""Conversations: create, chat (wait for the answer), post (don't wait), regenerate, history, live events."""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Response
from psycopg.errors import ForeignKeyViolation
from redis.exceptions import RedisError
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Message, Receive, Scope, Send

from gateway.deps import SessionDep, StateDep, only_params, require_key
from gateway.routes.cron import follow_in_beat
from gateway.schemas import (
    BAD_BODY,
    BIGINT_MAX,
    UNAUTHORIZED,
    Accepted,
    ChatIn,
    ChatOut,
    ConversationIn,
    ConversationInfo,
    ConversationOut,
    ConversationPatch,
    Id,
    MessageOut,
    RegenerateIn,
    TimedOut,
    ToolCallOut,
)
from gateway.state import AppState
from gateway.waiting import last_event_id, promptly, read_retrying, unread, wait_for_run
from shared import db
from shared.agent import conversations, views
from shared.agent.events import DELETED, FINAL, TEXT_DELTA, RedisEvents, watch
from shared.agent.events import read as read_events
from shared.agent.finish import CUT_OFF
from shared.agent.service import Submitted, after_commit, answer_again, command_of, submit
from shared.contracts import NO_NUL
from shared.db import get_engine
from shared.models import Conversation, RunStatus, ToolStatus, new_id
from shared.scheduling import jobs
from shared.tools.base import ErrorCode

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api/v1/conversations", tags=["conversations"], dependencies=[Depends(require_key)],
                   responses=UNAUTHORIZED)


def _origin(conversation_id: str) -> dict[str, str]:
    return {"channel": "api", "chat_id": conversation_id}


@router.post("", response_model=ConversationOut, responses=BAD_BODY)
def create_conversation(s: SessionDep, body: ConversationIn | None = None) -> ConversationOut:
    """A new API conversation."""
    cid = new_id()
    conv = conversations.get_or_create(s, session_key=f"api:{cid}", channel="api", chat_id=cid, conversation_id=cid,
                                       meta={"title": body.title} if body and body.title else {})
    s.commit()
    return ConversationOut(conversation_id=conv.id)


NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such conversation"}}


def _conversation(s: Session, conversation_id: str, *, lock: bool = False) -> Conversation:
    conv = s.get(Conversation, conversation_id, with_for_update=lock)
    if conv is None:
        raise HTTPException(404, f"no conversation {conversation_id}")
    return conv


@router.get("", response_model=list[ConversationInfo],
            dependencies=[Depends(only_params("channel", "q", "limit", "offset"))])
def list_conversations(
    s: SessionDep,
    channel: Annotated[str | None, Query(pattern=NO_NUL, max_length=64,
                                         description="api, a platform (telegram, slack, ...), or internal: the "
                                                     "sessions of cron jobs, subagents and the heartbeat, "
                                                     "only listed when asked for")] = None,
    q: Annotated[str | None, Query(pattern=NO_NUL, max_length=200, description="a piece of the title")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=BIGINT_MAX)] = 0,
) -> list[dict[str, Any]]:
    """Conversations, the most recently active first; `q` finds a title, in any case."""
    return views.conversations(s, channel=channel, query=q, limit=limit, offset=offset)


@router.get("/{conversation_id}", response_model=ConversationInfo, responses=NOT_FOUND)
def get_conversation(conversation_id: Id, s: SessionDep) -> dict[str, Any]:
    """One conversation: its title, where it came from, the turn running now, its usage."""
    return views.conversation(_conversation(s, conversation_id))


@router.patch("/{conversation_id}", response_model=ConversationInfo, responses={**BAD_BODY, **NOT_FOUND})
def rename_conversation(conversation_id: Id, body: ConversationPatch, s: SessionDep) -> dict[str, Any]:
    """Set the conversation's title (null removes it)."""
    conv = _conversation(s, conversation_id, lock=True)  # the meta is rewritten whole
    conv.meta = {k: v for k, v in conv.meta.items() if k != "title"} | ({"title": body.title} if body.title else {})
    s.add(conv)
    s.commit()
    return views.conversation(conv)


@router.delete("/{conversation_id}", status_code=204, responses={
    **NOT_FOUND, 409: {"description": "a turn or subagent of the conversation is still going (`runIds`): stop it"}})
def delete_conversation(conversation_id: Id, s: SessionDep, state: StateDep) -> Response:
    """Delete the conversation for good: its messages, runs, tool calls and sends not made yet, its
    subagents' sessions, the reminders (cron jobs) that post to it, its event stream (whose open
    readers get a last `conversation.deleted` event)."""
    key = s.exec(select(Conversation.session_key).where(Conversation.id == conversation_id)).first()
    deleted = conversations.delete_conversation(s, conversation_id)
    named = [*deleted, *([key] if key else [])]  # a job may name its chat by session key (the cron tool's)
    reminders = [job for c in named for job in jobs.listing(s, channel="api", chat_id=c, include_system=False)]
    for job in reminders:
        jobs.delete(s, job)
    s.commit()
    for job in reminders:
        follow_in_beat(state, None, job.id)
    try:  # open event streams see the deletion and end
        RedisEvents(state.redis).end(deleted)
    except RedisError as err:  # the stream expires by itself a day after its newest event
        log.warning("conversation %s deleted, its event stream not (%s)", conversation_id, err)
    return Response(status_code=204)


def _submit(state: AppState, conversation_id: str, body: ChatIn) -> Submitted:
    if body.model and (refusal := state.settings.llm.refuses(body.model)):
        raise HTTPException(422, refusal)
    with Session(get_engine(state.settings.database_url), expire_on_commit=False) as s:
        if command_of(body.message):  # answered without posting; a message to no conversation fails its insert
            _conversation(s, conversation_id)
        try:
            out = submit(state.runtime, s, conversation_id, body.message, origin=_origin(conversation_id),
                         model=body.model, images=body.photos())
            s.commit()
        except IntegrityError as err:  # deleted since it was read
            if not isinstance(err.orig, ForeignKeyViolation):
                raise
            raise HTTPException(404, f"no conversation {conversation_id}") from err
    after_commit(state.runtime, out)
    state.dispatch(out.nexts)
    return out


@router.post("/{conversation_id}/chat", response_model=ChatOut,
             responses={**BAD_BODY, **NOT_FOUND,
                        503: {"description": "Redis or the database is unreachable, busy or not answering; "
                                             "nothing was sent"},
                        504: {"model": TimedOut, "description": "no answer in time (a database or Redis outage "
                                                                "after the message was stored is waited out until "
                                                                "then), or this gateway is shutting down; the run "
                                                                "goes on"}})
async def chat(conversation_id: Id, body: ChatIn, state: StateDep) -> ChatOut:
    """Send a message and wait for the agent's answer (and the tool calls it made)."""
    since = await last_event_id(state, conversation_id)
    out = await run_in_threadpool(_submit, state, conversation_id, body)
    if out.reply is not None or out.message_id is None:
        return ChatOut(conversation_id=conversation_id, assistant_message=out.reply or "")
    # From here the message is stored: whatever fails, the answer is a 504 naming the run, never a
    # 503 (which says nothing was sent, and invites a retry that would send it twice).
    timeout = state.settings.agent.chat_timeout
    deadline = time.monotonic() + timeout
    run = await wait_for_run(state, conversation_id=conversation_id, message_id=out.message_id,
                             run_id=out.run_id, since=since, timeout=timeout)
    try:
        calls = await _settled_tool_calls(state, run.id, until=deadline)
    except Exception as err:
        if not db.unavailable(err):
            raise
        raise unread(conversation_id, run.id) from err
    text = run.final_text or ("Stopped." if run.status == RunStatus.CANCELLED else "")
    return ChatOut(conversation_id=conversation_id, assistant_message=text, tool_calls=calls,
                   run_id=run.id, status=run.status.value)


SETTLE_WAIT = 5.0  # seconds /chat waits for the outcome of a tool call its cancelled run left running


async def _settled_tool_calls(state: AppState, run_id: str, *, until: float) -> list[ToolCallOut]:
    """The ended run's tool calls with their outcomes. A call still running when its run was cancelled
    is stopped within about a second and records how it ended: that is waited for (SETTLE_WAIT at
    most; one still running after it is reported as failed, cut off). A read the database fails is
    tried again until `until` (the chat's deadline, time.monotonic())."""
    deadline = anyio.current_time() + SETTLE_WAIT
    while True:
        calls = await read_retrying(functools.partial(_tool_calls, state, run_id), until=until)
        if not any(c.status == ToolStatus.RUNNING for c in calls) or anyio.current_time() >= deadline:
            break
        await anyio.sleep(0.1)
    return [c.model_copy(update={"status": ToolStatus.FAILED.value, "result": CUT_OFF, "error_code": ErrorCode.FAILED})
            if c.status == ToolStatus.RUNNING else c for c in calls]


def _tool_calls(state: AppState, run_id: str) -> list[ToolCallOut]:
    with Session(get_engine(state.settings.database_url)) as s:
        return [ToolCallOut.model_validate(c) for c in views.tool_calls(s, [run_id])]


@router.post("/{conversation_id}/messages", status_code=202, response_model=Accepted,
             responses={**BAD_BODY, **NOT_FOUND})
async def post_message(conversation_id: Id, body: ChatIn, state: StateDep) -> Accepted:
    """Queue a message and return at once with the run that will handle it."""
    out = await run_in_threadpool(_submit, state, conversation_id, body)
    return Accepted(conversation_id=conversation_id, run_id=out.run_id, message_id=out.message_id,
                    queued=out.run_id is None and out.reply is None, reply=out.reply)


@router.post("/{conversation_id}/regenerate", status_code=202, response_model=Accepted,
             responses={**BAD_BODY, **NOT_FOUND, 409: {"description": "a turn is running, or there is no "
                                                                   "message to answer again"}})
async def regenerate(conversation_id: Id, state: StateDep, body: RegenerateIn | None = None) -> Accepted:
    """Answer the last user message again, as edited when `message` is given: the answer and tool
    results that followed it are deleted, the message moves to the end of the transcript (a new seq),
    and a new turn answers it (returned at once, as for posted messages)."""
    body = body or RegenerateIn()
    if body.model and (refusal := state.settings.llm.refuses(body.model)):
        raise HTTPException(422, refusal)

    def again() -> Submitted:
        with Session(get_engine(state.settings.database_url), expire_on_commit=False) as s:
            out = answer_again(state.runtime, s, conversation_id, content=body.message, model=body.model)
            s.commit()
        state.dispatch(out.nexts)
        return out

    out = await run_in_threadpool(again)
    return Accepted(conversation_id=conversation_id, run_id=out.run_id, message_id=out.message_id)


@router.get("/{conversation_id}/messages", response_model=list[MessageOut],
            responses=NOT_FOUND, dependencies=[Depends(only_params("limit", "offset", "after"))])
def list_messages(
    conversation_id: Id, s: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200, offset: Annotated[int, Query(ge=0, le=BIGINT_MAX)] = 0,
    after: Annotated[int | None, Query(ge=0, le=BIGINT_MAX, description="only messages with a larger seq")] = None,
) -> list[MessageOut]:
    """The conversation's messages in transcript order (`seq`), including any still waiting in the
    mailbox (`pending`). To follow a conversation, ask again with `after` = the largest seq of a
    NORMAL message that is not pending: the transcript's messages are written one turn at a time,
    each with a seq above all before it, and a waiting one is listed again, with a new seq, once a
    turn takes it in. SUMMARY messages are written beside the transcript (by compaction and the
    daily summary) and may land below such a cursor. (`offset` pages shift while a message waits:
    it moves to the end when taken in.)"""
    _conversation(s, conversation_id)
    rows = views.messages(s, conversation_id, limit=limit, offset=offset, after=after)
    return [MessageOut.model_validate(m) for m in rows]


READ_BLOCK_MS = 15_000  # one blocking read of a stream; gateway/state.py's read timeout outlasts it
# A Redis stream id (milliseconds-sequence, each part a 64-bit unsigned number, the sequence optional)
STREAM_ID = re.compile(r"(\d{1,20})(?:-(\d{1,20}))?", re.ASCII)


def _resume_after(last_event: str | None) -> str | None:
    """The stream id a `Last-Event-ID` header names (None without one); 400 for anything Redis refuses."""
    if not last_event:
        return None
    match = STREAM_ID.fullmatch(last_event)
    if match is None or any(int(part) >= 2**64 for part in match.groups() if part):
        raise HTTPException(400, "Last-Event-ID must be the id of an event from this stream "
                                 "(like 1718000000000-0), or 0 to replay what the stream still holds")
    return last_event


def _require_conversation(state: AppState, conversation_id: str) -> None:
    with Session(get_engine(state.settings.database_url)) as s:
        _conversation(s, conversation_id)


@router.get("/{conversation_id}/events",
            responses={200: {"content": {"text/event-stream": {}}}, 400: {"description": "a malformed Last-Event-ID"},
                       404: {"description": "no such conversation"},
                       503: {"description": "too many open streams, or Redis unreachable or busy"}})
async def events(
    conversation_id: Id, state: StateDep,
    last_event: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventSourceResponse:
    """Server-Sent Events: run started, step started, text deltas, tools, run finished or failed.
    Text deltas are produced only while at least one client reads this stream. `Last-Event-ID`
    resumes after that event (`0` replays what the stream still holds); without it, the stream
    starts at the newest event now, and every read goes on from the last id seen."""
    # Everything that can refuse the request runs before the response starts: after that, an error
    # can only cut the stream short, and the client would see a 200 and reconnect forever.
    resume = _resume_after(last_event)
    await run_in_threadpool(_require_conversation, state, conversation_id)
    since = resume or await last_event_id(state, conversation_id)  # never "$": a gap between reads
    await promptly(watch(state.aredis, conversation_id))  # the next LLM call streams
    if state.streams >= state.max_streams:  # checked after the last await: no other request slips in between
        raise HTTPException(503, f"too many open event streams ({state.max_streams}); try again shortly",
                            headers={"Retry-After": "5"})

    async def stream() -> AsyncIterator[dict[str, str]]:
        nonlocal since
        ended = Ended()
        while True:
            await watch(state.aredis, conversation_id)
            for entry_id, fields in await read_events(state.aredis, conversation_id, since, READ_BLOCK_MS):
                since = entry_id
                event, data = fields.get("event", "message"), fields.get("data", "{}")
                if not ended.stale(event, data):
                    yield {"id": entry_id, "event": event, "data": data}
                if event == DELETED:
                    return

    return CountedStream(state, stream())


class Ended:
    """The runs a stream told the end of. Text a run's model call streamed after its run was stopped
    (the call is not cut short) is dropped: a client would add it to a turn it was told had ended."""

    KEEP = 100  # the latest runs remembered

    def __init__(self) -> None:
        self.runs: dict[str, None] = {}

    def stale(self, event: str, data: str) -> bool:
        if event != TEXT_DELTA and event not in FINAL:
            return False
        try:
            run_id = json.loads(data).get("run_id")
        except (ValueError, AttributeError):
            return False
        if event == TEXT_DELTA:
            return run_id in self.runs
        self.runs[run_id] = None
        if len(self.runs) > self.KEEP:
            del self.runs[next(iter(self.runs))]
        return False


class CountedStream(EventSourceResponse):
    """An event stream counted in `state.streams` from the moment it is made until it ends, however it
    ends (the generator's own `finally` would miss a stream that ends before its first read).

    When the server shuts down (SIGTERM), sse-starlette stops the stream but leaves its body open, and
    uvicorn logs that as an error; so the body is ended here: the client sees the stream end and
    reconnects (to another gateway, or this one once it is back). An error in the stream still
    reaches uvicorn, which logs it."""

    def __init__(self, state: AppState, content: AsyncIterator[dict[str, str]]) -> None:
        self.server_stopping = anyio.Event()  # sse-starlette sets it when the server begins to shut down
        super().__init__(content, ping=15, shutdown_event=self.server_stopping)
        self.state = state
        state.streams += 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ended = False

        async def noting_the_end(message: Message) -> None:
            nonlocal ended
            ended = ended or (message["type"] == "http.response.body" and not message.get("more_body", False))
            await send(message)

        try:
            await super().__call__(scope, receive, noting_the_end)
            if self.server_stopping.is_set() and not ended:
                log.debug("event stream of %s ended: the gateway is shutting down", scope["path"])
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.state.streams -= 1
