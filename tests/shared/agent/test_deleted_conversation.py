"""A conversation deleted while work of it is still under way, in-process on real Postgres: what
comes back after the deletion finds nothing to write to, and ends quietly; a message being posted
holds the deletion off."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg.errors import LockNotAvailable
from sqlalchemy import exc, text
from sqlmodel import Session

from shared.agent import conversations
from shared.agent.finish import cancel_conversation
from shared.agent.local import drain
from shared.agent.runtime import Next, Runtime
from shared.constants import T_AGENT_STEP
from shared.db import get_engine, session_scope
from shared.models import Conversation, ToolCall
from tests.support.stack import Stack


def _turn(rt: Runtime, message: str) -> tuple[str, str | None]:
    """A new conversation and the turn `message` starts in it."""
    with rt.session() as s:
        cid = conversations.get_or_create(s, session_key=f"t:deleted-{message}").id
        return cid, conversations.post_message(s, cid, message, origin={},
                                               lease_seconds=rt.settings.runtime.lease_seconds).run_id


def test_a_tool_that_finishes_after_its_conversation_was_deleted_ends_quietly(
        make_stack: Callable[..., Stack]) -> None:
    """/stop leaves a running tool to finish (its run is cancelled, so DELETE goes ahead); its
    result then had no run to be written to, and the task failed with NoResultFound."""
    rt = Runtime.build(make_stack().settings)
    cid, run_id = _turn(rt, "call:time {}")
    execute = rt.tools.execute

    async def stopped_and_deleted_meanwhile(*args: Any, **kwargs: Any) -> Any:
        with rt.session() as s:
            cancel_conversation(rt, s, cid, [])
        with rt.session() as s:
            conversations.delete_conversation(s, cid)
        return await execute(*args, **kwargs)

    rt.tools.execute = stopped_and_deleted_meanwhile  # type: ignore[method-assign]
    assert drain(rt, [Next(T_AGENT_STEP, (run_id, 0))]) == []
    with rt.session() as s:
        assert s.get(Conversation, cid) is None and s.query(ToolCall).count() == 0


def test_a_model_answer_that_comes_after_its_conversation_was_deleted_ends_quietly(
        make_stack: Callable[..., Stack]) -> None:
    """/stop, then DELETE, while the model is still answering: the answer had no run to be written
    to, and the step failed with NoResultFound (an ERROR traceback in the worker log)."""
    rt = Runtime.build(make_stack().settings)
    cid, run_id = _turn(rt, "hello")
    complete = rt.llm.complete

    def stopped_and_deleted_meanwhile(*args: Any, **kwargs: Any) -> Any:
        with rt.session() as s:
            cancel_conversation(rt, s, cid, [])
        with rt.session() as s:
            conversations.delete_conversation(s, cid)
        return complete(*args, **kwargs)

    rt.llm.complete = stopped_and_deleted_meanwhile  # type: ignore[method-assign]
    assert drain(rt, [Next(T_AGENT_STEP, (run_id, 0))]) == []
    with rt.session() as s:
        assert s.get(Conversation, cid) is None


def test_a_messages_lookup_holds_off_a_deletion_only(make_stack: Callable[..., Stack]) -> None:
    """While a webhook's transaction posts a message, the conversation it found cannot be deleted
    (the message would have nowhere to go), but a step may still take a turn or add usage to it;
    a command's lookup (/stop locks runs next, and a run ending locks its conversation after its
    run) holds nothing."""
    settings = make_stack().settings
    with session_scope(settings.database_url) as s:
        cid = conversations.get_or_create(s, session_key="t:lookup").id
    engine = get_engine(settings.database_url)

    def waits(statement: str) -> bool:
        with engine.connect() as other:
            other.execute(text("set lock_timeout = '1s'"))
            try:
                other.execute(text(statement), {"cid": cid})
            except exc.OperationalError as err:
                assert isinstance(err.orig, LockNotAvailable), err
                return True
            finally:
                other.rollback()
            return False

    step = "update conversations set active_run_id = null, prompt_tokens = prompt_tokens + 1 where id = :cid"
    deletion = "select id from conversations where id = :cid for update"
    for keep, deletion_waits in ((True, True), (False, False)):
        with Session(engine) as posting:
            assert conversations.find(posting, "t:lookup", keep=keep) == cid
            assert not waits(step)
            assert waits(deletion) is deletion_waits
