"""Two transactions at once on real Postgres, in one test process: pause one just before it sends a
statement until the other waits for a lock it holds, to see whether the two can deadlock."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, event, text

from shared.agent import conversations, lease, steps
from shared.agent.finish import cancel_conversation
from shared.agent.runtime import Runtime
from shared.db import get_engine
from shared.llm_types import LLMResponse, LLMToolCall
from shared.models import Phase, ToolCall
from shared.tools.base import ToolResult
from tests.support.processes import wait_until

LEASE = 30.0  # long: only the test moves a lease
WAIT = 15.0  # seconds a side may take to come to a lock; Postgres's deadlock_timeout is 1 s


def waits_for(engine: Engine, pid: int) -> bool:
    """Whether some transaction waits for a lock that backend `pid` holds."""
    with engine.connect() as conn:
        return bool(conn.execute(text("select exists(select 1 from pg_stat_activity "
                                      "where cast(:pid as integer) = any(pg_blocking_pids(pid)))"),
                                 {"pid": pid}).scalar())


@contextmanager
def before(engine: Engine, prefix: str, action: Callable[[int], None]) -> Iterator[None]:
    """Call `action(backend pid)` the first time a statement starting with `prefix` (any case) is
    about to be sent, in the thread sending it, on the connection it is sent on."""
    fired: list[bool] = []

    def hook(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if fired or not statement.lstrip().lower().startswith(prefix.lower()):
            return
        fired.append(True)
        action(cursor.connection.info.backend_pid)

    event.listen(engine, "before_cursor_execute", hook)
    try:
        yield
    finally:
        event.remove(engine, "before_cursor_execute", hook)


def in_thread(name: str, work: Callable[[], object], errors: dict[str, BaseException]) -> threading.Thread:
    """Start `work` in a thread of its own; what it raises goes into `errors[name]`."""
    def run() -> None:
        try:
            work()
        except BaseException as err:  # reported by the test
            errors[name] = err

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t


@dataclass(frozen=True)
class Late:
    """A cancelled run whose tool call was still running: its result comes after the cancel."""

    conversation_id: str
    run_id: str
    call: ToolCall


def tools_phase(rt: Runtime, *, session_key: str, channel: str = "api", tool: str = "time",
                arguments: str = "{}") -> tuple[str, str, str]:
    """A turn whose first step asked for one call of `tool`: (conversation, run, call row) ids."""
    with rt.session() as s:
        cid = conversations.get_or_create(s, session_key=session_key, channel=channel).id
        run_id = conversations.post_message(s, cid, "hi", origin={}, lease_seconds=LEASE).run_id
        assert run_id is not None
    with rt.session() as s:
        assert lease.acquire(s, run_id=run_id, seq=0, phase=Phase.LLM, owner="w", seconds=LEASE)
        conversations.fold_mailbox(s, cid, run_id)  # as the step does: no message waits for a next turn
    asked = [LLMToolCall(id="c0", name=tool, arguments=arguments)]
    [nxt] = steps._record(rt, run_id, 0, LLMResponse(content="", tool_calls=asked), 1.0)
    return cid, run_id, str(nxt.args[0])


def cancelled_with_a_call_running(rt: Runtime, *, session_key: str, channel: str = "api") -> Late:
    cid, run_id, call_id = tools_phase(rt, session_key=session_key, channel=channel)
    with rt.session() as s:  # a tool worker took the call
        s.execute(text("update tool_calls set status = 'RUNNING', attempts = 1 where id = :id"), {"id": call_id})
    with rt.session() as s:
        cancel_conversation(rt, s, cid, [])
    with rt.session() as s:
        call = s.get_one(ToolCall, call_id)
    return Late(cid, run_id, call)


def race_with_late_result(rt: Runtime, late: Late, deletion: Callable[[], object]) -> dict[str, BaseException]:
    """Write the late result while `deletion` runs: the write locks the run, then waits until the
    deletion waits for one of its locks before it goes on to the call's row. What each side raised."""
    engine = get_engine(rt.settings.database_url)
    errors: dict[str, BaseException] = {}
    holding = threading.Event()

    def once_the_deletion_waits(pid: int) -> None:
        holding.set()
        wait_until(lambda: waits_for(engine, pid), timeout=WAIT, message="the deletion to wait for the run")

    with before(engine, "update tool_calls", once_the_deletion_waits):
        writer = in_thread("result", lambda: steps._write_result(rt, late.call, ToolResult.success("12:00")), errors)
        assert holding.wait(WAIT), "the result's write never came to the call's row"
        deleting = in_thread("deletion", deletion, errors)
        for t in (writer, deleting):
            t.join(WAIT * 2)
            assert not t.is_alive(), f"{t.name} still going"
    return errors
