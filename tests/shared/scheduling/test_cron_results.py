"""Where a cron job made in a chat sends its results, and replays of the `cron` tool (plain core, no Celery)."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta

from sqlalchemy import text
from sqlmodel import Session, col, select

from gateway.local_agent import one_turn
from shared.agent import conversations
from shared.agent.local import HANDLERS, drain
from shared.agent.runtime import Next, Runtime
from shared.constants import INTERNAL, T_AGENT_STEP, T_CRON_RECONCILE, T_SUBAGENT_STEP
from shared.db import get_engine
from shared.models import Conversation, CronJob, Message, Role, RunKind, RunStatus, ToolCall, utcnow
from shared.scheduling import cron
from shared.scheduling.beat import BeatMirror
from shared.scheduling.schedules import whole_second
from shared.tools.base import ErrorCode, ToolContext
from shared.tools.cron import CronArgs, CronTool
from tests.support.processes import wait_until
from tests.support.scheduling import TELEGRAM, call, db, parent_call, runs
from tests.support.stack import Stack

Core = Callable[..., tuple[Stack, Runtime, BeatMirror]]


def posted(stack: Stack, conversation_id: str) -> list[Message]:
    with db(stack) as s:
        return list(s.exec(select(Message).where(Message.conversation_id == conversation_id,
                                                 col(Message.meta)["kind"].astext == "cron_result")))


def set_turn(stack: Stack, conversation_id: str, run_id: str | None) -> None:
    with db(stack) as s:
        conv = s.get_one(Conversation, conversation_id)
        conv.active_run_id = run_id
        s.add(conv)


def add_and_fire(stack: Stack, rt: Runtime, mirror: BeatMirror, ctx: ToolContext, text: str) -> list[str]:
    """The model adds a one-shot job in its chat; beat fires it; returns the tasks left for Celery."""
    at = utcnow() + timedelta(seconds=30)
    added = asyncio.run(CronTool().run(CronArgs(action="add", message=text, at=at), ctx))
    assert added.ok, added
    left = drain(rt, cron.fire(rt, mirror, added.output["job_id"], whole_second(at)))
    return [n.task for n in left]


def test_an_api_chat_gets_its_cron_result_once(core: Core) -> None:
    stack, rt, mirror = core()
    ctx = parent_call(stack, "cron")
    set_turn(stack, ctx.conversation_id, None)  # the turn that scheduled it has ended
    assert add_and_fire(stack, rt, mirror, ctx, "remind me: drink water") == []
    [run] = runs(stack, kind=RunKind.CRON)
    [message] = posted(stack, ctx.conversation_id)
    assert run.status == RunStatus.SUCCEEDED and run.announced
    assert (message.role, message.content, message.meta["cron_run_id"]) == (Role.ASSISTANT, run.final_text, run.id)
    drain(rt, cron.reconcile(rt, mirror))
    assert len(posted(stack, ctx.conversation_id)) == 1  # exactly once
    with db(stack) as s:  # the chat goes on: its history is one the model accepts
        turn = conversations.post_message(s, ctx.conversation_id, "thanks", origin=ctx.extra["origin"],
                                          lease_seconds=2).run_id
    assert turn is not None
    drain(rt, [Next(T_AGENT_STEP, (turn, 0))])
    [*_, last] = runs(stack, conversation_id=ctx.conversation_id)
    assert last.status == RunStatus.SUCCEEDED and last.final_text == "echo: thanks"


def test_a_platform_chat_keeps_its_reminder_in_its_conversation(core: Core) -> None:
    """The reminder went to Telegram through the outbox, and the chat's conversation never had it: a
    reply to it ("done, thanks") reached the model without the reminder. Now the conversation keeps
    what the run sent there with the `message` tool, then its answer, once."""
    stack, rt, mirror = core(**TELEGRAM, TOOLS__ALLOWED=json.dumps(["cron", "message"]))
    with db(stack) as s:
        conv = conversations.get_or_create(s, session_key="telegram:4242", channel="telegram", chat_id="4242")
        origin = {"channel": "telegram", "chat_id": "4242", "reply_meta": {}}
        run_id = conversations.try_start_turn(s, conv.id, origin=origin, lease_seconds=2)
        s.add(ToolCall(run_id=run_id, step_seq=1, call_id="call_1", name="cron"))
    ctx = ToolContext(settings=stack.settings, run_id=run_id, conversation_id=conv.id, channel="telegram",
                      chat_id="4242", call_id="call_1", extra={"origin": origin})
    set_turn(stack, conv.id, None)
    sent = call("message", content="Time to stretch!", channel="Telegram")  # (the tool reads it in lower case)
    add_and_fire(stack, rt, mirror, ctx, sent + "\nand say so")
    [run] = runs(stack, kind=RunKind.CRON)
    assert run.status == RunStatus.SUCCEEDED and run.announced
    assert [m.content for m in posted(stack, conv.id)] == ["Time to stretch!", run.final_text]
    drain(rt, cron.reconcile(rt, mirror))
    assert len(posted(stack, conv.id)) == 2  # once
    with db(stack) as s:
        elsewhere = s.exec(select(Message).where(col(Message.meta)["kind"].astext == "cron_result",
                                                 Message.conversation_id != conv.id)).all()
    assert elsewhere == []


def test_a_result_waits_while_the_chat_is_in_a_turn(core: Core) -> None:
    """Written during a turn, it could land between the turn's tool call and that call's result."""
    stack, rt, mirror = core()
    ctx = parent_call(stack, "cron")  # its turn is still going
    assert add_and_fire(stack, rt, mirror, ctx, "remind me: stretch") == [T_CRON_RECONCILE]  # try again soon
    assert posted(stack, ctx.conversation_id) == []
    drain(rt, cron.reconcile(rt, mirror))
    assert posted(stack, ctx.conversation_id) == []  # still in the turn
    set_turn(stack, ctx.conversation_id, None)
    drain(rt, cron.reconcile(rt, mirror))
    drain(rt, cron.reconcile(rt, mirror))
    [message] = posted(stack, ctx.conversation_id)
    [run] = runs(stack, kind=RunKind.CRON)
    assert message.content == run.final_text and "remind me: stretch" in message.content


def test_a_replayed_remove_reports_the_job_removed(core: Core) -> None:
    """The worker died after the remove committed, before its result was kept: the call runs again."""
    stack, _, mirror = core()
    ctx = parent_call(stack, "cron")
    added = asyncio.run(CronTool().run(CronArgs(action="add", message="x", every_seconds=3600), ctx))
    jid = added.output["job_id"]
    with db(stack) as s:
        s.add(ToolCall(run_id=ctx.run_id, step_seq=3, call_id="call_9", name="cron", attempts=1))
    ctx.call_id = "call_9"
    remove = CronArgs(action="remove", job_id=jid)
    first = asyncio.run(CronTool().run(remove, ctx))
    with db(stack) as s:  # what the recovery sweeper and the next claim do to the journal row
        call = s.exec(select(ToolCall).where(ToolCall.call_id == "call_9")).one()
        call.attempts = 2
        s.add(call)
    again = asyncio.run(CronTool().run(remove, ctx))
    assert first.ok and again.ok and again.output["removed"] == jid, again
    assert mirror.armed(jid) is None
    other = asyncio.run(CronTool().run(CronArgs(action="remove", job_id="nosuchjob"), replace(ctx, call_id="call_1")))
    assert not other.ok and other.error == ErrorCode.NOT_FOUND  # a first try still says what is wrong


def test_the_cron_tool_in_nanofleet_agent_still_schedules(core: Core) -> None:
    """`nanofleet agent`'s chat id is its session key: it names a conversation, if not an API one, so
    the job is accepted (its results stay in its own session)."""
    stack, _, _ = core()
    answer = one_turn(stack.settings, message=call("cron", action="add", message="x", every_seconds=3600),
                      session="cli:default")
    with db(stack) as s:
        made = [(j.channel, j.chat_id) for j in s.exec(select(CronJob))]
    assert answer.ok and made == [("api", "cli:default")], answer.text


def test_a_firing_that_meets_a_turn_starting_in_its_session_waits_for_it(core: Core) -> None:
    """A subagent's report (or a waiting message) took the job's session just after the firing saw it
    idle: the firing was recorded and its run never started, so it was lost (helper's review). Now
    the firing waits for that turn and fires once it has ended."""
    stack, rt, mirror = core()
    ctx = parent_call(stack, "cron")
    at = utcnow() + timedelta(seconds=30)
    added = asyncio.run(CronTool().run(CronArgs(action="add", message="remind me: water", at=at), ctx))
    jid = added.output["job_id"]
    with db(stack) as s:
        session = conversations.get_or_create(s, session_key=cron.SESSION_PREFIX + jid, channel=INTERNAL,
                                              chat_id=jid).id
    reporter = Session(get_engine(stack.settings.database_url))
    reporter.exec(select(Conversation).where(Conversation.id == session).with_for_update()).one()
    with ThreadPoolExecutor(1) as pool:
        firing = pool.submit(cron.fire, rt, mirror, jid, whole_second(at))
        wait_until(lambda: waiting_on_locks(stack) > 0, timeout=10, message="the firing to meet the session's lock")
        report = conversations.try_start_turn(reporter, session, origin={}, lease_seconds=2)
        assert report is not None
        reporter.commit()
        reporter.close()
        firing.result(timeout=10)
    with db(stack) as s:
        assert s.get(CronJob, jid) is not None  # not fired: its session was busy
    assert runs(stack, kind=RunKind.CRON) == []
    set_turn(stack, session, None)  # the report's turn ended
    drain(rt, cron.fire(rt, mirror, jid, whole_second(at)))
    [run] = runs(stack, kind=RunKind.CRON)
    assert run.status == RunStatus.SUCCEEDED


def waiting_on_locks(stack: Stack) -> int:
    with db(stack) as s:
        return int(s.execute(text("select count(*) from pg_stat_activity where datname = current_database() "
                                  "and wait_event_type = 'Lock'")).scalar_one())


def test_a_subagent_a_job_spawns_reports_into_its_api_chat(core: Core) -> None:
    """The job's run spawns a subagent that ends after it: its report comes to the job's session, and
    the answer the model gives it there goes where the job's results go (it stayed in the job's
    session, unseen)."""
    stack, rt, mirror = core()
    ctx = parent_call(stack, "cron")
    set_turn(stack, ctx.conversation_id, None)
    at = utcnow() + timedelta(seconds=30)
    added = asyncio.run(CronTool().run(CronArgs(action="add", message=call("spawn", task="look up the tides"), at=at),
                                       ctx))
    queue, subagent_steps = deque(cron.fire(rt, mirror, added.output["job_id"], whole_second(at))), []
    while queue:  # the job's run to its end, its subagent's steps held back
        nxt = queue.popleft()
        if nxt.task == T_SUBAGENT_STEP:
            subagent_steps.append(nxt)
        elif nxt.task in HANDLERS:
            queue.extend(HANDLERS[nxt.task](rt, nxt))
    [job_run] = runs(stack, kind=RunKind.CRON)
    assert job_run.status == RunStatus.SUCCEEDED and len(posted(stack, ctx.conversation_id)) == 1
    drain(rt, subagent_steps)
    [_, report_turn] = runs(stack, kind=RunKind.CRON)
    assert report_turn.conversation_id == job_run.conversation_id
    assert "look up the tides" in str(report_turn.final_text)
    shown = [(m.content, m.meta["cron_run_id"]) for m in posted(stack, ctx.conversation_id)]
    assert shown == [(job_run.final_text, job_run.id), (report_turn.final_text, report_turn.id)]


def test_what_a_job_sends_with_the_message_tool_reaches_its_api_chat(core: Core) -> None:
    """On a platform, `message` sends to the job's chat; into an API chat it is posted with the result."""
    stack, rt, mirror = core(TOOLS__ALLOWED=json.dumps(["cron", "message"]))
    ctx = parent_call(stack, "cron")
    set_turn(stack, ctx.conversation_id, None)
    assert add_and_fire(stack, rt, mirror, ctx, call("message", content="time to stretch")) == []
    [run] = runs(stack, kind=RunKind.CRON)
    shown = [m.content for m in posted(stack, ctx.conversation_id)]
    assert shown == ["time to stretch", run.final_text], shown
    [sent] = [c for c in calls_of(stack, run.id) if c.name == "message"]
    assert sent.result is not None
    assert sent.result["output"]["delivered"] == "with this job's result, when this run ends"


def calls_of(stack: Stack, run_id: str) -> list[ToolCall]:
    with db(stack) as s:
        return list(s.exec(select(ToolCall).where(ToolCall.run_id == run_id)))
