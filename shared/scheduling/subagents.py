"""Subagents: a child run of kind `subagent` in its own session, and its one announcement.

`spawn` creates the child (id derived from the spawning tool call, so a replayed call finds it
instead of making a second) and returns at once. When the child ends, its finish hook writes the
report into the parent conversation's mailbox in the same transaction that ends the child, and
starts a turn there (or the report waits for the active one). A crash anywhere after that commit
finds the report in the mailbox (the sweeper starts its turn), and a crash before it leaves the
child unfinished (the lease sweeper resumes it): the parent hears exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, text
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, col, select

from shared.agent import conversations, lease, steps, views
from shared.agent.runtime import Next, Runtime
from shared.constants import INTERNAL, REPORT, T_AGENT_STEP, T_SUBAGENT_STEP
from shared.db import LOCK_NOT_AVAILABLE, session_scope, sqlstate
from shared.models import Conversation, Message, Role, Run, RunKind, RunStatus
from shared.scheduling.ids import call_key, derived
from shared.settings import Settings

SESSION_PREFIX = "subagent:"
# POST /api/v1/subagents/{id}/cancel, or /api/v1/runs/{id}/cancel naming a subagent's run: announce() reports it
CANCELLED_ALONE = "cancelled on its own through the API"
ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING)
QUOTE_CHARS = 8000
# Seconds a spawn waits for its parent run's and conversation's locks: well inside the spawn tool's
# timeout, which cannot stop the thread doing it. A spawn that waited longer made its child after its
# call was reported failed (and retryable), and the model's retry made a second one.
LOCK_WAIT = 10.0


class LimitReached(Exception):
    """The conversation already runs as many subagents as allowed."""

    def __init__(self, running: int, limit: int) -> None:
        super().__init__(f"{running} subagents are already running in this conversation (limit {limit})")
        self.running = running
        self.limit = limit


class ParentStopped(Exception):
    """The spawning turn ended (a /stop, a cancel) before the spawn: nothing may start for it."""

    def __init__(self, status: RunStatus) -> None:
        super().__init__(f"the turn was stopped ({status.value}); no subagent was started")
        self.status = status


class ParentBusy(Exception):
    """The spawning run or its conversation stayed locked for LOCK_WAIT s: nothing was started."""

    def __init__(self) -> None:
        super().__init__(f"the conversation stayed busy for {LOCK_WAIT:g} s; no subagent was started: try again")


@dataclass(frozen=True)
class Spawned:
    run_id: str
    label: str
    replayed: bool  # the tool call ran before and had already created it


def children_of_conversation(conversation_id: str) -> Any:
    return col(Run.parent_run_id).in_(select(Run.id).where(Run.conversation_id == conversation_id))


def running(s: Session, conversation_id: str) -> int:
    return int(s.exec(select(func.count()).select_from(Run).where(
        Run.kind == RunKind.SUBAGENT, col(Run.status).in_(ACTIVE), children_of_conversation(conversation_id),
    )).one())


def spawn(settings: Settings, *, parent_run_id: str, call_id: str, task: str, label: str | None) -> Spawned:
    """Create the child run and its session; raises LimitReached, ParentStopped when the parent run
    ended, or ParentBusy when its locks stayed held. Enqueue its step 0 afterwards."""
    try:
        with session_scope(settings.database_url) as s:
            s.execute(text(f"set local lock_timeout = {int(LOCK_WAIT * 1000)}"))
            return _spawn(s, settings, parent_run_id=parent_run_id, call_id=call_id, task=task, label=label)
    except OperationalError as err:
        if sqlstate(err) != LOCK_NOT_AVAILABLE:
            raise
        raise ParentBusy() from None


def _spawn(s: Session, settings: Settings, *, parent_run_id: str, call_id: str, task: str,
           label: str | None) -> Spawned:
    # The parent first, then its conversation, as cancellation locks them: a /stop either ended
    # the parent before this (refused here) or waits and then cancels the child with it.
    parent = s.get_one(Run, parent_run_id, with_for_update=True)
    if parent.status not in ACTIVE:
        raise ParentStopped(parent.status)
    s.get_one(Conversation, parent.conversation_id, with_for_update=True)  # one count at a time
    cid = derived("subagent", call_key(s, parent.id, call_id))
    if (existing := s.get(Run, cid)) is not None:
        return Spawned(existing.id, existing.label or "", replayed=True)
    if (n := running(s, parent.conversation_id)) >= settings.subagents.max_concurrent:
        raise LimitReached(n, settings.subagents.max_concurrent)
    label = label or " ".join(task.split())[:40]
    conv = conversations.get_or_create(s, session_key=SESSION_PREFIX + cid, channel=INTERNAL, chat_id=cid,
                                       meta={"parent_conversation_id": parent.conversation_id, "label": label})
    conv.active_run_id = cid  # the child holds its session's turn lock until it finishes
    origin = {**(parent.origin or {}), "conversation_id": parent.conversation_id}
    s.add(conv)
    child = Run(id=cid, conversation_id=conv.id, kind=RunKind.SUBAGENT, parent_run_id=parent.id, label=label,
                task=task, origin=origin, model=parent.model, max_iterations=settings.subagents.max_iterations)
    child.lease_until = lease.until(settings.runtime.lease_seconds)  # on the sweeper's clock (see try_start_turn)
    s.add(child)
    # In the transcript at once (not the mailbox): a cancel before step 0 must not leave it to start a turn.
    s.add(Message(conversation_id=conv.id, run_id=cid, role=Role.USER, content=task, meta={"origin": origin}))
    return Spawned(cid, label, replayed=False)


def first_step(run_id: str) -> Next:
    return Next(T_SUBAGENT_STEP, (run_id, 0))


def _quote(said: str) -> str:
    said = said if len(said) <= QUOTE_CHARS else said[:QUOTE_CHARS] + " [...]"
    return "\n".join(f"> {line}" for line in (said.strip() or "(nothing)").splitlines())


def report(child: Run) -> str:
    """The announcement the parent conversation reads (quoted, so nothing in it reads as a command)."""
    text = child.final_text or ""
    if child.status == RunStatus.FAILED:
        outcome = f"failed ({child.error or 'no reason given'})"
    elif child.status == RunStatus.CANCELLED:
        outcome = "was cancelled through the API before it finished"
    elif child.iteration >= child.max_iterations and text == steps.bound_message(child.max_iterations):
        outcome = f"stopped at its limit of {child.max_iterations} steps without a final answer"
    else:
        outcome = "finished"
    return (f"[subagent report, not written by the user] Your background subagent '{child.label}' "
            f"({child.id}) {outcome}.\nTask:\n{_quote(child.task or '')}\nResult:\n{_quote(text)}\n"
            "Tell the user what came of it, briefly and in their terms.")


def announce(rt: Runtime, s: Session, child: Run) -> list[Next]:
    """Finish hook for subagents: one report into the parent's mailbox, and a turn to tell the user.
    None for one stopped with its conversation (/stop, its turn cancelled): the user stopped it; one
    cancelled on its own through the API reports that, or the user told "I'll report back" hears nothing."""
    if (child.status == RunStatus.CANCELLED and child.error != CANCELLED_ALONE) or child.announced:
        return []
    origin = {k: v for k, v in (child.origin or {}).items() if k != "conversation_id"}
    parent_conv = (child.origin or {}).get("conversation_id")
    if parent_conv is None:
        parent = s.get(Run, child.parent_run_id) if child.parent_run_id else None
        parent_conv = parent.conversation_id if parent else None
    if parent_conv is None:
        return []
    s.add(Message(conversation_id=parent_conv, role=Role.USER, content=report(child), pending=True,
                  meta={"origin": origin, "subagent_run_id": child.id, "kind": REPORT}))
    child.announced = True
    s.add(child)
    s.flush()
    run_id = conversations.try_start_turn(s, parent_conv, origin=origin,
                                          lease_seconds=rt.settings.runtime.lease_seconds,
                                          max_iterations=rt.settings.agent.max_iterations)
    return [Next(T_AGENT_STEP, (run_id, 0))] if run_id else []


def listing(s: Session, *, conversation_id: str | None = None, status: RunStatus | None = None,
            limit: int = 100, offset: int = 0) -> list[Run]:
    query = select(Run).where(Run.kind == RunKind.SUBAGENT)
    if conversation_id is not None:
        query = query.where(children_of_conversation(conversation_id))
    if status is not None:
        query = query.where(Run.status == status)
    return list(s.exec(query.order_by(col(Run.created_at).desc()).offset(offset).limit(limit)))


def summary(run: Run) -> dict[str, Any]:
    return {
        "subagentId": run.id, "label": run.label, "task": run.task, "status": run.status.value,
        "parentRunId": run.parent_run_id, "parentConversationId": (run.origin or {}).get("conversation_id"),
        "sessionConversationId": run.conversation_id, "iteration": run.iteration,
        "maxIterations": run.max_iterations, "result": run.final_text, "error": run.error,
        "announced": run.announced, "createdAt": run.created_at.isoformat(),
        "finishedAt": run.finished_at.isoformat() if run.finished_at else None,
    }


def detail(s: Session, run: Run) -> dict[str, Any]:
    return {**views.run(s, run), **summary(run)}
