"""The sweeper: re-enqueues the current step of runs whose lease expired (a worker died, or the
broker lost the task), starts turns for mailboxes nobody is serving, and sends again the /new
summaries still due."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import func, update
from sqlmodel import Session, col, select

from shared.agent import conversations, lease, memory, steps
from shared.agent.finish import finish, publish_final
from shared.agent.runtime import Next, Runtime
from shared.constants import T_AGENT_STEP, T_COMPACT, T_TOOL_EXECUTE
from shared.models import Conversation, Message, Phase, Run, RunStatus, ToolCall, ToolStatus, utcnow
from shared.tools.base import ErrorCode, ToolResult

log = logging.getLogger(__name__)
BATCH = 200
GAVE_UP = ("Sorry, I had to stop: the worker handling this request kept crashing on the same step. "
           "Try again, perhaps with a smaller request.")

# Extra sweeps registered by other parts (outbox redelivery, cron reconciliation).
EXTRA_SWEEPS: list[Callable[[Runtime], list[Next]]] = []


def sweep(rt: Runtime, conversation_id: str | None = None) -> list[Next]:
    """One pass (over one conversation only: `nanofleet agent` after a crash); returns the tasks to
    enqueue. A run it cannot recover is logged and left for a later pass (no sooner than
    `requeue_grace`), and so is a part that fails: the rest of the pass goes on without them."""
    nexts: list[Next] = []
    ready: list[tuple[str, int]] = []  # tools phases whose calls all have results
    failed: list[Run] = []  # runs given up on: their step kept killing workers
    with rt.session() as s:
        for run in _expired(s, conversation_id):
            try:
                with s.begin_nested():
                    nexts += _recover(rt, s, run, ready, failed)
            except Exception:
                log.exception("run %s: the sweep could not recover it; a later one tries again", run.id)
                _later(rt, s, run.id)
    for run in failed:
        publish_final(rt, run)
    for run_id, step_seq in ready:
        nexts += _isolated(f"run {run_id}: moving on from its tools", steps.advance, rt, run_id, step_seq)
    parts: list[Callable[[Runtime], list[Next]]] = [
        lambda rt: _orphan_mailboxes(rt, conversation_id),
        lambda rt: [Next(T_COMPACT, (cid, True)) for cid in memory.resend_summaries(rt, conversation_id)],
        *(EXTRA_SWEEPS if conversation_id is None else ()),
    ]
    for part in parts:
        nexts += _isolated("a part of the sweep", part, rt)
    return nexts


def _isolated(what: str, part: Callable[..., list[Next]], *args: object) -> list[Next]:
    """`part(*args)`, or nothing (logged) if it fails: one fault does not stop the rest of the sweep."""
    try:
        return part(*args)
    except Exception:
        log.exception("sweep: %s failed; a later sweep tries again", what)
        return []


def _later(rt: Runtime, s: Session, run_id: str) -> None:
    """Leave a run the sweep could not recover alone for `requeue_grace`, so its error is logged
    once per grace, not on every pass."""
    _extend(s, run_id, rt.settings.runtime.requeue_grace)


def _extend(s: Session, run_id: str, seconds: float, **values: object) -> None:
    """Push the run's lease `seconds` ahead on Postgres's clock (the one leases are compared on),
    setting `values` too."""
    s.execute(update(Run).where(col(Run.id) == run_id).values(lease_until=lease.until(seconds), **values)
              .execution_options(synchronize_session=False))


def _expired(s: Session, conversation_id: str | None) -> list[Run]:
    query = select(Run).where(col(Run.status).in_((RunStatus.QUEUED, RunStatus.RUNNING)),
                              col(Run.lease_until) < func.now())
    if conversation_id is not None:
        query = query.where(Run.conversation_id == conversation_id)
    # SKIP LOCKED: the sweep never waits for a run, so the order it takes them in cannot deadlock (lease.py)
    return list(s.exec(query.order_by(col(Run.lease_until)).limit(BATCH).with_for_update(skip_locked=True)))


def _recover(rt: Runtime, s: Session, run: Run, ready: list[tuple[str, int]], failed: list[Run]) -> list[Next]:
    lost = run.phase == Phase.LLM and run.lease_owner is not None  # its worker died in the step
    if lost and steps.count_failure(run) >= rt.settings.runtime.max_recoveries:
        log.error("run %s: step %d was lost %d times; failing the run", run.id, run.step_seq, run.recoveries)
        ended = finish(rt, s, run, status=RunStatus.FAILED, store=False, text=GAVE_UP,
                       error=f"step {run.step_seq}: its worker died {run.recoveries} times")
        failed.append(run)  # once it has ended: its end is published after the pass
        return ended
    calls = [] if run.phase == Phase.LLM else \
        s.exec(select(ToolCall).where(ToolCall.run_id == run.id, ToolCall.step_seq == run.step_seq)).all()
    running = [c for c in calls if c.status == ToolStatus.RUNNING]
    if running and (run.lease_owner != lease.STALLED or _any_young(rt, s, running)):
        log.info("run %s: lease expired in tools step %d with a call running; one more lease before the "
                 "call is taken for dead (shared.agent.lease)", run.id, run.step_seq)
        _extend(s, run.id, rt.settings.runtime.lease_seconds, lease_owner=lease.STALLED)
        return [Next(T_TOOL_EXECUTE, (c.id,)) for c in calls if c.status == ToolStatus.PENDING]
    log.info("run %s: lease expired in %s step %d; re-enqueueing", run.id, run.phase, run.step_seq)
    # A backlog can hold the re-enqueued task for a while: don't pile up more copies meanwhile.
    _extend(s, run.id, max(rt.settings.runtime.lease_seconds, rt.settings.runtime.requeue_grace), lease_owner=None)
    if run.phase == Phase.LLM:
        return [Next(steps.step_task(run), (run.id, run.step_seq))]
    nexts: list[Next] = []
    for call in calls:
        if call.status == ToolStatus.RUNNING:
            _interrupted(rt, s, call)
        if call.status == ToolStatus.PENDING:
            nexts.append(Next(T_TOOL_EXECUTE, (call.id,)))
    if all(c.status in steps.DONE for c in calls):
        ready.append((run.id, run.step_seq))
    return nexts


def _any_young(rt: Runtime, s: Session, calls: list[ToolCall]) -> bool:
    """Whether one of `calls` started within the last lease (on Postgres's clock, which stamped it):
    its worker may be alive and not have renewed yet."""
    since = lease.db_now(s) - timedelta(seconds=rt.settings.runtime.lease_seconds)
    return any(c.started_at is not None and c.started_at > since for c in calls)


def _interrupted(rt: Runtime, s: Session, call: ToolCall) -> None:
    """A worker died inside this tool. Idempotent tools run again, unless they keep taking their
    worker down; others are never re-run blind."""
    tool = rt.tools.get(call.name)
    if tool is not None and tool.idempotent and call.attempts < rt.settings.runtime.max_recoveries:
        call.status = ToolStatus.PENDING
    else:
        message = (f"the worker running this tool died {call.attempts} times; it was not tried again"
                   if tool is not None and tool.idempotent else
                   "the worker running this tool stopped before it reported; it may or may not have taken "
                   "effect. Check before trying again.")
        result = ToolResult.fail(ErrorCode.FAILED, message, retryable=not (tool and tool.idempotent))
        call.status = ToolStatus.FAILED
        call.result = result.model_dump(mode="json")
        call.finished_at = utcnow()
    s.add(call)


def _orphan_mailboxes(rt: Runtime, conversation_id: str | None) -> list[Next]:
    """Messages waiting in a conversation with no active turn (a lost race or a crash) get one."""
    with rt.session() as s:
        return _start_orphans(rt, s, conversation_id)


def _start_orphans(rt: Runtime, s: Session, conversation_id: str | None) -> list[Next]:
    query = (select(Conversation.id)
             .where(col(Conversation.active_run_id).is_(None))
             .where(col(Conversation.id).in_(select(Message.conversation_id).where(col(Message.pending).is_(True)))))
    if conversation_id is not None:
        query = query.where(Conversation.id == conversation_id)
    ids = s.exec(query.limit(BATCH)).all()
    nexts = []
    for cid in ids:
        first = conversations.pending_messages(s, cid)[0]
        run_id = conversations.try_start_turn(
            s, cid, origin=first.meta.get("origin", {}), lease_seconds=rt.settings.runtime.lease_seconds,
            model=first.meta.get("model"), max_iterations=rt.settings.agent.max_iterations,
        )
        if run_id:
            nexts.append(Next(T_AGENT_STEP, (run_id, 0)))
    return nexts
