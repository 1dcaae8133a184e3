"""Lock order on real Postgres, in-process, two transactions at once: deleting a conversation,
cancelling a run and renewing leases take the runs first, in id order, then conversations, then
the rows under them, as a step does; none of them deadlocks with another."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy import exc, text
from sqlmodel import select

from shared.agent import conversations, lease, steps
from shared.agent.finish import CUT_OFF, NOT_RUN, cancel_conversation
from shared.agent.runtime import Runtime
from shared.db import get_engine
from shared.models import Conversation, Message, Role, Run, RunStatus, ToolCall
from tests.support.locks import (
    LEASE,
    WAIT,
    before,
    cancelled_with_a_call_running,
    in_thread,
    race_with_late_result,
    tools_phase,
    waits_for,
)
from tests.support.processes import wait_until
from tests.support.stack import Stack


def test_a_late_tool_result_and_the_deletion_of_its_conversation_do_not_deadlock(
        make_stack: Callable[..., Stack]) -> None:
    """/stop leaves a running tool to finish, so its conversation may be deleted while the result is
    written: the write locks the run, then the call's row; the deletion took the call's row, then
    waited for the run, and Postgres aborted it as a deadlock (a 500 for the DELETE)."""
    rt = Runtime.build(make_stack().settings)
    late = cancelled_with_a_call_running(rt, session_key="t:late-result")

    def delete() -> None:
        with rt.session() as s:
            conversations.delete_conversation(s, late.conversation_id)

    assert race_with_late_result(rt, late, delete) == {}
    with rt.session() as s:
        assert s.get(Conversation, late.conversation_id) is None
        assert s.exec(select(ToolCall).where(ToolCall.run_id == late.run_id)).all() == []


def test_lease_renewals_take_runs_in_id_order(make_stack: Callable[..., Stack]) -> None:
    """A process renews all its leases in one statement, which took the runs in the table's order:
    a transaction that takes runs in id order (a /stop, a deletion) holding the first and waiting
    for the second, which the renewal held while it waited for the first, deadlocked with it."""
    rt = Runtime.build(make_stack().settings)
    with rt.session() as s:
        cid = conversations.get_or_create(s, session_key="t:renewals").id
        for run_id in ("run-2", "run-1"):  # stored in this order: a scan meets run-2 first
            s.add(Run(id=run_id, conversation_id=cid, status=RunStatus.RUNNING, lease_owner="w"))
    engine = get_engine(rt.settings.database_url)
    keeper = lease.LeaseKeeper(rt.settings.database_url, LEASE)
    errors: dict[str, BaseException] = {}
    with engine.connect() as ordered:
        ordered.execute(text("select id from runs where id = 'run-1' for update"))
        pid = ordered.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        renewing = in_thread("renewal", lambda: keeper.renew([lease.Held(r, "w", None) for r in ("run-2", "run-1")]),
                             errors)
        wait_until(lambda: waits_for(engine, pid), timeout=WAIT, message="the renewal to wait for run-1")
        try:
            ordered.execute(text("select id from runs where id = 'run-2' for update"))
        except exc.OperationalError as err:
            errors["ordered"] = err
        ordered.rollback()
        renewing.join(WAIT)
    assert not renewing.is_alive() and errors == {}


def test_a_call_taken_as_its_run_is_cancelled_either_runs_or_is_said_not_to(make_stack: Callable[..., Stack]) -> None:
    """A /stop read the step's calls, found one waiting and wrote it off as not run; a tool worker
    that took it in between ran the tool, its result was dropped, and the transcript said it had
    not run (so the model might have it done again)."""
    st = make_stack()
    rt = Runtime.build(st.settings)
    cid, run_id, call_id = tools_phase(rt, session_key="t:taken", tool="record", arguments='{"tag": "once"}')
    engine = get_engine(rt.settings.database_url)
    errors: dict[str, BaseException] = {}
    worker: list[threading.Thread] = []

    def taken_meanwhile(pid: int) -> None:
        worker.append(in_thread("tool", lambda: steps.tool_step(rt, call_id), errors))
        wait_until(lambda: not worker[0].is_alive() or waits_for(engine, pid), timeout=WAIT,
                   message="the tool's worker to finish or wait for the cancel")

    with before(engine, "update tool_calls", taken_meanwhile), rt.session() as s:
        cancel_conversation(rt, s, cid, [])
    worker[0].join(WAIT)
    assert not worker[0].is_alive() and errors == {}
    log = st.workspace / "executions.log"
    ran = log.exists() and log.read_text().count("once") == 1
    with rt.session() as s:
        answer = s.exec(select(Message.content).where(Message.run_id == run_id, Message.role == Role.TOOL)).one()
    assert (CUT_OFF in answer if ran else NOT_RUN in answer), (ran, answer)
