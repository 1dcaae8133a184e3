"""The two kinds of step. Each reads the run from Postgres, does one LLM call or one tool call,
writes the result, and returns the tasks to enqueue next. Running a step twice is harmless."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy import bindparam, func, update
from sqlmodel import Session, col, select
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_exponential

from shared.agent import conversations, events, lease, memory, prompt, usage
from shared.agent.finish import NOT_RUN, finish, publish_final, recorded, settle, tool_message
from shared.agent.runtime import Next, Runtime
from shared.aio import run_sync
from shared.constants import EMPTY_ANSWER, T_AGENT_STEP, T_COMPACT, T_SUBAGENT_STEP, T_TOOL_EXECUTE
from shared.contracts import without_nul
from shared.db import Inserting, returning_row, table_of, unavailable, updated_row
from shared.errors import Retryable
from shared.llm_types import LLMError, LLMResponse
from shared.models import (
    ACTIVE,
    Message,
    Phase,
    Role,
    Run,
    RunKind,
    RunStatus,
    RunStep,
    ToolCall,
    ToolStatus,
)
from shared.outbox import typing_loop
from shared.tools.base import ErrorCode, ToolContext, ToolResult
from shared.tools.run_watch import run_status

log = logging.getLogger(__name__)
RESULT_WRITE_BUDGET = 25.0  # seconds; the tool task's time limit leaves 30 after the longest tool timeout
SUBAGENT_EXCLUDED = ("message", "spawn", "cron")
UNTAKEABLE = "_untakeable"  # marks stored arguments that lost what JSONB cannot hold
NO_NUL_ARGS = ("the arguments hold a NUL character (\\u0000) or a lone surrogate, which no tool takes; "
               "call it again without them")
DONE = (ToolStatus.SUCCESS, ToolStatus.REJECTED, ToolStatus.FAILED)
# A chat turn whose model answered nothing (and sent nothing with the message tool) still gets a reply
FAILED_STEP = ("Sorry, I had to stop: something went wrong on my side each time I tried to go on with this. "
               "Send your message again; if it keeps happening, the operator can find the error in the worker log.")
# Errors another try may well not meet (the database or the broker was unreachable or busy): the task
# base or the sweeper tries the step again, as often as it takes; they never count as its failures.
TRANSIENT: tuple[type[BaseException], ...] = (
    Retryable, BrokerError, redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError,
)


def step_task(run: Run) -> str:
    return T_SUBAGENT_STEP if run.kind == RunKind.SUBAGENT else T_AGENT_STEP


def bound_message(n: int) -> str:
    return (
        f"I stopped after {n} steps without reaching a final answer. "
        "Tell me how you'd like to continue, or narrow the request."
    )


def llm_step(rt: Runtime, run_id: str, seq: int) -> list[Next]:
    """One LLM call for step `seq` of the run, under the run's lease. Taking the lease, folding in
    the mailbox and reading the prompt are one transaction. A step that raises is tried again (the
    sweeper re-enqueues it when its lease expires); one that raised max_recoveries times fails its run."""
    owner = rt.owner()
    try:
        return _llm_step(rt, run_id, seq, owner)
    except Exception as err:
        if transient(err):
            raise
        nexts = _failed(rt, run_id, seq, owner, err)
        if nexts is None:
            raise
        return nexts


def transient(err: BaseException) -> bool:
    """Whether `err` is one another try may well not meet: it never counts as a failure of the step."""
    return isinstance(err, TRANSIENT) or unavailable(err)


def count_failure(run: Run) -> int:
    """Count one more failure of the run's current step (it raised, or its worker died in it);
    returns how many times it failed."""
    if run.recovered_seq == run.step_seq:
        run.recoveries += 1
    else:
        run.recovered_seq, run.recoveries = run.step_seq, 1
    return run.recoveries


def _failed(rt: Runtime, run_id: str, seq: int, owner: str, err: Exception) -> list[Next] | None:
    """Count the failure of step `seq`: the run's end once the step failed max_recoveries times, else
    None (raise: the step is tried again). A step someone else holds, or that ended, is not counted."""
    try:
        with rt.session() as s:
            run = s.get(Run, run_id, with_for_update=True)
            if run is None or run.step_seq != seq or run.phase != Phase.LLM or run.status not in ACTIVE:
                return None
            if run.lease_owner not in (None, owner) and lease.live(s, run):
                return None
            failures, bound = count_failure(run), rt.settings.runtime.max_recoveries
            if failures < bound:
                log.warning("run %s: step %d failed (%d of %d tries): %r", run_id, seq, failures, bound, err)
                _release(run, rt.settings.runtime.lease_seconds)  # the sweeper re-enqueues it, as no lost step
                s.add(run)
                return None
            log.error("run %s: step %d failed %d times; failing the run: %r", run_id, seq, failures, err)
            nexts = _give_up(rt, s, run, f"step {seq} failed {failures} times; the last time: {err!r}")
    except Exception:
        log.exception("run %s: could not record the failure of step %d", run_id, seq)
        return None
    publish_final(rt, run)
    return nexts


def _give_up(rt: Runtime, s: Session, run: Run, error: str) -> list[Next]:
    """Fail the run (locked by the caller). It takes the waiting messages its step would have taken
    (they stay pending when the step raised before it committed), or they would start a turn that
    fails the same way, and another after it."""
    if rt.settings.agent.mailbox_mode == "steer" or run.iteration == 0:
        conversations.fold_mailbox(s, run.conversation_id, run.id)
    return finish(rt, s, run, status=RunStatus.FAILED, text=FAILED_STEP, store=False, error=error[:1000])


def _llm_step(rt: Runtime, run_id: str, seq: int, owner: str) -> list[Next]:
    acquired = time.monotonic()
    with rt.session() as s:
        run = lease.acquire(s, run_id=run_id, seq=seq, phase=Phase.LLM, owner=owner,
                            seconds=rt.settings.runtime.lease_seconds)
        if run is None:
            return []
        _forget_retired_model(rt, s, run)
        if run.iteration >= run.max_iterations:  # messages that came meanwhile stay for the next turn
            bounded = finish(rt, s, run, status=RunStatus.SUCCEEDED, text=bound_message(run.max_iterations))
        else:
            bounded = None
            if rt.settings.agent.mailbox_mode == "steer" or run.iteration == 0:
                conversations.fold_mailbox(s, run.conversation_id, run.id)
            tools = rt.tools.specs(exclude=SUBAGENT_EXCLUDED if run.kind == RunKind.SUBAGENT else ())
            built = prompt.build(s, rt.settings, run, sees_images=rt.llm.sees_images(run.model))
            messages, kept = memory.fit(rt, built, run.model, tools)
    if bounded is not None:
        publish_final(rt, run)
        return bounded
    if seq == 0 and run.kind == RunKind.TURN and run.recoveries == 0:  # a recovered step's loop still runs
        rt.send_now(typing_loop(rt.settings, run.origin or {}, run.id))
    keeper = lease.keeper(rt.settings.database_url, rt.settings.runtime.lease_seconds)
    with keeper.hold(run_id, owner=owner, taken=acquired):
        return _call(rt, run, seq, messages, tools, kept)


def _forget_retired_model(rt: Runtime, s: Session, run: Run) -> None:
    """A run that took its chat's /model choice, a profile the operator has since removed, runs on the
    default model (its chat's /model says so) instead of failing every turn until someone notices."""
    if run.model is None or run.model in rt.settings.llm.profiles or "/" in run.model:
        return
    if conversations.chosen_model(s, run.conversation_id) == run.model:
        log.warning("run %s: its chat chose model %r, which is no longer a profile; the default model answers",
                    run.id, run.model)
        run.model = None
        s.add(run)


def _call(rt: Runtime, run: Run, seq: int, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
          kept: int | None) -> list[Next]:
    opening: list[tuple[str, dict[str, Any]]] = [(events.RUN_STARTED, {"run_id": run.id, "kind": run.kind})] \
        if seq == 0 else []
    opening.append((events.STEP_STARTED, {"run_id": run.id, "seq": seq, "kind": "llm"}))
    watched = rt.events.publish_watched(run.conversation_id, opening)
    started = time.perf_counter()
    def ended() -> bool:  # (stopped while its text streams)
        return run_status(rt.settings.database_url, run.id) not in ACTIVE

    deltas = events.Deltas(rt.events, run.conversation_id, run.id, ended) if watched else None
    try:
        response = rt.llm.complete(messages, tools=tools or None, model=run.model, on_delta=deltas)
    except LLMError as err:
        log.warning("run %s: LLM call failed: %s", run.id, err)
        return _finish_if_current(rt, run.id, seq, status=RunStatus.FAILED, text=err.user_message,
                                  store=False, error=str(err))
    finally:
        if deltas is not None:
            deltas.flush()
    elapsed = (time.perf_counter() - started) * 1000
    nexts = _record(rt, run.id, seq, response, elapsed)
    if kept is not None and rt.settings.memory.context_strategy == "summarize":  # summarise what was cut
        nexts.append(Next(T_COMPACT, (run.conversation_id, False, kept + 1)))  # and keep the answer just stored
    return nexts


def _finish_if_current(rt: Runtime, run_id: str, seq: int, **kw: Any) -> list[Next]:
    with rt.session() as s:
        run = s.get(Run, run_id, with_for_update=True)
        if run is None or run.step_seq != seq or run.status not in ACTIVE:  # (None: its conversation deleted)
            return []
        nexts = finish(rt, s, run, **kw)
    publish_final(rt, run)
    return nexts


def _record(rt: Runtime, run_id: str, seq: int, response: LLMResponse, elapsed_ms: float) -> list[Next]:
    """Write the model's answer and move the run on; a duplicate of this step writes nothing, nor does
    one whose run was deleted with its conversation while the model answered. One whose run was
    stopped meanwhile records what the call cost, and nothing else."""
    with rt.session() as s:
        run = s.get(Run, run_id, with_for_update=True)
        if run is None or run.step_seq != seq:
            return []
        if run.phase != Phase.LLM or run.status not in ACTIVE:
            if run.phase == Phase.DONE:  # it ended during the call
                usage.add(s, run, response, seq, elapsed_ms, late=True)
            return []
        usage.add(s, run, response, seq, elapsed_ms)
        if not response.tool_calls:
            silent = not response.content.strip() and run.kind == RunKind.TURN and not run.suppress_reply
            nexts = finish(rt, s, run, status=RunStatus.SUCCEEDED, text=EMPTY_ANSWER if silent else response.content)
            final = True
        else:
            nexts = _start_tools(s, run, response, rt.settings.runtime.lease_seconds)
            final = False
    if final:
        publish_final(rt, run)
    return nexts


def _parse_arguments(raw: str) -> dict[str, Any]:
    """The call's arguments as stored. JSON may spell a NUL (\\u0000) or a lone surrogate, which JSONB
    cannot hold: stored without them, and marked so that the call is refused, not run on other
    arguments than the model's (a path, a command, a file's content)."""
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {"_invalid_json": raw}
    if not isinstance(value, dict):
        return {"_invalid_json": raw}
    stored: dict[str, Any] = without_nul(value, lone_surrogates=True)
    return stored if stored == value else {**stored, UNTAKEABLE: NO_NUL_ARGS}


def _start_tools(s: Session, run: Run, response: LLMResponse, lease_seconds: float) -> list[Next]:
    specs = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
             for c in response.tool_calls]
    conversations.add_messages(s, Message(conversation_id=run.conversation_id, run_id=run.id, role=Role.ASSISTANT,
                                          content=response.content, tool_calls=specs))
    calls = [ToolCall(run_id=run.id, step_seq=run.step_seq + 1, position=i, call_id=c.id, name=c.name,
                      arguments=_parse_arguments(c.arguments)) for i, c in enumerate(response.tool_calls)]
    ADD_CALLS(s, *calls)
    run.phase = Phase.TOOLS
    run.step_seq += 1
    run.iteration += 1
    _release(run, lease_seconds)
    s.add(run)
    s.flush()
    return [Next(T_TOOL_EXECUTE, (c.id,)) for c in calls]


def _release(run: Run, lease_seconds: float) -> None:
    """Hand the run to whoever runs the next step; the sweeper steps in if nobody does. The lease is
    written on Postgres's clock (an SQL expression: run.lease_until is expired by the flush, and
    must not be read once the session is gone)."""
    run.lease_owner = None
    run.lease_until = lease.until(lease_seconds)


_CALLS = table_of(ToolCall)
ADD_CALLS, ADD_RUN_STEP = Inserting(ToolCall, generated=()), Inserting(RunStep)
CLAIM_CALL = returning_row(ToolCall, update(_CALLS).where(
    _CALLS.c.id == bindparam("call"), _CALLS.c.status == ToolStatus.PENDING.value,
).values(status=ToolStatus.RUNNING.value, attempts=_CALLS.c.attempts + 1, started_at=func.now()))

WRITE_RESULT = update(_CALLS).where(
    _CALLS.c.id == bindparam("call"), _CALLS.c.status == ToolStatus.RUNNING.value,
).values(status=bindparam("outcome"), result=bindparam("output"), elapsed_ms=bindparam("elapsed"),
         finished_at=func.now())


def tool_step(rt: Runtime, tool_call_id: str) -> list[Next]:
    """Execute one tool call, unless the journal already has its result."""
    with rt.session() as s:
        call: ToolCall | None = updated_row(s, CLAIM_CALL, {"call": tool_call_id})
        claimed = call is not None
        call = call or s.get(ToolCall, tool_call_id)
        run = s.get(Run, call.run_id) if call else None
    if call is None or run is None:
        return []
    if not claimed:
        return advance(rt, run.id, call.step_seq) if call.status in DONE else []
    ctx = _context(rt, run, call)
    # The lease is held until the result is written: the sweeper leaves a call alone while it renews.
    with lease.keeper(rt.settings.database_url, rt.settings.runtime.lease_seconds).hold(run.id, step=call.step_seq):
        result = _execute(rt, run, call, ctx) if run.status in ACTIVE else ToolResult.fail(ErrorCode.FAILED, NOT_RUN)
        nexts = _journal(rt, call, result)
    if nexts is None:  # its conversation was deleted meanwhile (a cancelled run's tool went on)
        return ctx.followups
    rt.events.publish(run.conversation_id, events.TOOL_FINISHED, {
        "run_id": run.id, "call_id": call.call_id, "tool": call.name, "status": result.status,
        "elapsed_ms": result.elapsed_ms})
    return [*ctx.followups, *nexts]


def _journal(rt: Runtime, call: ToolCall, result: ToolResult) -> list[Next] | None:
    """Write the call's result and move its run on; None when the run is gone. Tried again in place
    while the database is unreachable: the call has run, and a later try of the task would find it
    running and leave it to the sweeper, which could only report it as maybe done."""
    def retrying(state: RetryCallState) -> None:
        log.warning("run %s: tool call %s ran; writing its result failed, trying again: %s", call.run_id, call.id,
                    state.outcome.exception() if state.outcome else None)

    return Retrying(retry=retry_if_exception(unavailable), stop=stop_after_delay(RESULT_WRITE_BUDGET),
                    wait=wait_exponential(0.1, max=2.0), before_sleep=retrying, reraise=True)(
        _write_result, rt, call, result)


def _write_result(rt: Runtime, call: ToolCall, result: ToolResult) -> list[Next] | None:
    with rt.session() as s:  # the run first, as the sweeper, cancellation and a deletion lock (shared.agent.lease)
        locked = s.get(Run, call.run_id, with_for_update=True)
        if locked is None:
            return None
        output = without_nul(result.model_dump(mode="json"), lone_surrogates=True)  # a command may print a NUL
        s.execute(WRITE_RESULT, {"call": call.id, "outcome": result.status, "output": output,
                                 "elapsed": result.elapsed_ms})
        if locked.status not in ACTIVE:  # cancelled while it ran
            settle(s, locked, call, ToolResult.model_validate(output))
        return _advance(rt, s, locked, call.step_seq)


def _context(rt: Runtime, run: Run, call: ToolCall) -> ToolContext:
    origin = run.origin or {}
    return ToolContext(
        settings=rt.settings, run_id=run.id, conversation_id=run.conversation_id,
        channel=origin.get("channel", "api"), chat_id=str(origin.get("chat_id", "")), run_kind=run.kind.value,
        call_id=call.call_id,
        emit=lambda event, data: rt.events.publish(run.conversation_id, event, {"run_id": run.id, **data}),
        extra={"origin": origin, "parent_run_id": run.parent_run_id},
    )


def _execute(rt: Runtime, run: Run, call: ToolCall, ctx: ToolContext) -> ToolResult:
    rt.events.publish(run.conversation_id, events.TOOL_STARTED,
                      {"run_id": run.id, "call_id": call.call_id, "tool": call.name})
    args: dict[str, Any] | str = call.arguments
    if "_invalid_json" in call.arguments:
        args = str(call.arguments["_invalid_json"])
    if UNTAKEABLE in call.arguments:
        return rt.tools.audited(call.name, args, ctx, ToolResult.fail(ErrorCode.INVALID_ARGS, NO_NUL_ARGS))
    if run.kind == RunKind.SUBAGENT and call.name in SUBAGENT_EXCLUDED:
        refused = ToolResult.fail(ErrorCode.NOT_ALLOWED, f"subagents cannot use '{call.name}'")
        return rt.tools.audited(call.name, args, ctx, refused)
    return run_sync(rt.tools.execute(call.name, args, ctx))


STEP_CALLS = (select(ToolCall).where(ToolCall.run_id == bindparam("rid"), ToolCall.step_seq == bindparam("seq"))
              .order_by(col(ToolCall.position)))


def advance(rt: Runtime, run_id: str, step_seq: int) -> list[Next]:
    """When every tool call of the step has a result, add them to the transcript and go on (a run
    deleted with its conversation goes nowhere)."""
    with rt.session() as s:
        run = s.get(Run, run_id, with_for_update=True)
        return [] if run is None else _advance(rt, s, run, step_seq)


def _advance(rt: Runtime, s: Session, run: Run, step_seq: int) -> list[Next]:
    """`advance` for a run the caller has locked."""
    if run.phase != Phase.TOOLS or run.step_seq != step_seq or run.status not in ACTIVE:
        return []
    calls = list(s.exec(STEP_CALLS, params={"rid": run.id, "seq": step_seq}))
    if any(c.status not in DONE for c in calls):
        return []
    conversations.add_messages(s, *(tool_message(run, c, recorded(c)) for c in calls))
    ADD_RUN_STEP(s, RunStep(run_id=run.id, seq=step_seq, kind=Phase.TOOLS, elapsed_ms=sum(c.elapsed_ms for c in calls)))
    run.phase = Phase.LLM
    run.step_seq += 1
    _release(run, rt.settings.runtime.lease_seconds)
    s.add(run)
    return [Next(step_task(run), (run.id, run.step_seq))]
