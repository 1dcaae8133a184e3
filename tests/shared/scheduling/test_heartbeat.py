"""The heartbeat: nothing to do costs nothing; a cheap decision, then a run whose result goes to the
most recently active chat; one decision per interval; a session that stays small."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, func, select

from shared.agent import conversations
from shared.agent.local import drain
from shared.agent.runtime import Runtime
from shared.constants import T_CRON_RECONCILE, T_HEARTBEAT
from shared.models import Conversation, Message, Outbox, Role, Run, RunKind, RunStatus, utcnow
from shared.queueing import Producer, beat_schedule, make_celery
from shared.scheduling import cron, heartbeat
from shared.scheduling.beat import BeatMirror
from shared.settings import HeartbeatSettings, load_settings
from tests.fakes.llm import FakeLLM, Reply, default_handler
from tests.support.processes import wait_until
from tests.support.scheduling import call, db, runs
from tests.support.stack import Stack

Core = Callable[..., tuple[Stack, Runtime, BeatMirror]]


def test_an_empty_heartbeat_file_makes_no_llm_call(sched: Stack, fake_llm: FakeLLM) -> None:
    stack = sched
    (stack.workspace / "HEARTBEAT.md").write_text("# Heartbeat\n\n- [ ] \n<!-- add tasks here -->\n")
    worker, producer = stack.procs[-1], Producer(make_celery(stack.settings))
    seen = worker.log().count("is empty or missing")
    for _ in range(3):  # what beat sends every interval
        producer.send(T_HEARTBEAT)
    wait_until(lambda: worker.log().count("is empty or missing") >= seen + 3, message="three heartbeats")
    assert fake_llm.calls() == 0
    assert runs(stack) == []


def test_the_heartbeat_is_scheduled_only_when_enabled(sched: Stack) -> None:
    on = sched.settings.model_copy(update={"heartbeat": HeartbeatSettings(enabled=True, interval=7)})
    assert beat_schedule(on)["nanofleet-heartbeat"]["schedule"] == timedelta(seconds=7)
    assert "nanofleet-heartbeat" not in beat_schedule(sched.settings)  # the tests turn it off
    assert "nanofleet-cron-reconcile" in beat_schedule(sched.settings)


def decide_with(answer: str) -> Callable[[dict[str, Any]], Reply]:
    def handler(body: dict[str, Any]) -> Reply:
        text = str(body["messages"][-1].get("content") or "")
        return Reply(text=answer) if "Answer RUN or SKIP" in text else default_handler(body)

    return handler


def test_a_due_task_runs_and_reaches_the_latest_chat(core: Core, fake_llm: FakeLLM) -> None:
    stack, rt, _ = core(HEARTBEAT__MODEL="openai/cheap-model")
    (stack.workspace / "HEARTBEAT.md").write_text("# Tasks\n- check the deploy\n" + call("record", tag="hb") + "\n")
    with db(stack) as s:
        for chat in ("11", "77"):  # 77 spoke last
            latest = conversations.get_or_create(s, session_key=f"telegram:{chat}", channel="telegram", chat_id=chat)
            s.flush()
    fake_llm.handler = decide_with("RUN")
    now = utcnow()
    drain(rt, heartbeat.beat(rt, now, delivery="beat-1"))
    [decision, *_] = fake_llm.requests
    assert decision["model"] == "cheap-model"
    [run] = runs(stack, kind=RunKind.HEARTBEAT)
    assert run.status == RunStatus.SUCCEEDED and run.final_text == "done: recorded hb"
    with db(stack) as s:
        [sent] = s.exec(select(Outbox)).all()
    assert (sent.channel, sent.chat_id, sent.content) == ("telegram", "77", "done: recorded hb")
    with db(stack) as s:  # and the chat's conversation keeps it: a reply to it is read with it
        kept = s.exec(select(Message.content, Message.meta).where(Message.conversation_id == latest.id)).all()
    assert [(content, meta["kind"]) for content, meta in kept] == [("done: recorded hb", "heartbeat_result")]
    calls = fake_llm.calls()
    assert heartbeat.beat(rt, now, delivery="beat-1") == [] and fake_llm.calls() == calls  # a replay does nothing
    # The same heartbeat sent again by a beat that lost its lock (a new message id): no second
    # decision, no second run, no second message (helper's review: the user got it twice).
    assert heartbeat.beat(rt, now, delivery="beat-2") == [] and fake_llm.calls() == calls
    assert len(runs(stack, kind=RunKind.HEARTBEAT)) == 1


def kept_results(stack: Stack, conversation_id: str) -> list[str]:
    with db(stack) as s:
        return list(s.exec(select(Message.content).where(Message.conversation_id == conversation_id,
                                                         col(Message.meta)["kind"].astext == "heartbeat_result")))


def test_a_result_for_a_chat_in_a_turn_is_kept_once_the_turn_ends(core: Core, fake_llm: FakeLLM) -> None:
    """Written during the chat's turn, it could land between a tool call and its result; it was
    not kept at all, and a reply to it reached the model without it."""
    stack, rt, mirror = core()
    (stack.workspace / "HEARTBEAT.md").write_text("- check the deploy\n" + call("record", tag="hb") + "\n")
    with db(stack) as s:
        chat = conversations.get_or_create(s, session_key="telegram:77", channel="telegram", chat_id="77")
        chat.active_run_id = "a-turn"
        s.add(chat)
    fake_llm.handler = decide_with("RUN")
    assert T_CRON_RECONCILE in [n.task for n in drain(rt, heartbeat.beat(rt))]  # try again soon
    assert kept_results(stack, chat.id) == []
    with db(stack) as s:
        assert s.exec(select(func.count()).select_from(Outbox)).one() == 1  # delivered meanwhile, all the same
    drain(rt, cron.reconcile(rt, mirror))
    assert kept_results(stack, chat.id) == []  # still in its turn
    with db(stack) as s:
        s.get_one(Conversation, chat.id).active_run_id = None
    drain(rt, cron.reconcile(rt, mirror))
    drain(rt, cron.reconcile(rt, mirror))
    assert kept_results(stack, chat.id) == ["done: recorded hb"]


def test_a_quiet_heartbeat_says_nothing_then_or_later(core: Core, fake_llm: FakeLLM) -> None:
    stack, rt, mirror = core()
    (stack.workspace / "HEARTBEAT.md").write_text("- check the deploy\n")
    with db(stack) as s:
        chat = conversations.get_or_create(s, session_key="telegram:77", channel="telegram", chat_id="77")
    fake_llm.handler = lambda body: Reply(text="RUN" if decisions_in(body) else heartbeat.QUIET)
    assert drain(rt, heartbeat.beat(rt)) == []
    drain(rt, cron.reconcile(rt, mirror))  # (where results that waited for their chat are kept)
    [run] = runs(stack, kind=RunKind.HEARTBEAT)
    assert run.status == RunStatus.SUCCEEDED and run.final_text == heartbeat.QUIET
    assert kept_results(stack, chat.id) == []
    with db(stack) as s:
        assert s.exec(select(func.count()).select_from(Outbox)).one() == 0
        s.get_one(Run, run.id).announced = False  # as a worker from before 0015 left a quiet one
    drain(rt, cron.reconcile(rt, mirror))
    assert kept_results(stack, chat.id) == []


def decisions_in(body: dict[str, Any]) -> bool:
    return "Answer RUN or SKIP" in str(body["messages"][-1].get("content"))


def test_the_result_goes_to_the_thread_the_chat_last_spoke_in_even_with_its_runs_pruned(core: Core) -> None:
    """The thread comes from the chat's newest message, which retention keeps; it used to come from
    its newest turn run, and with that pruned the result reached the channel but not the thread."""
    stack, _, _ = core()
    with db(stack) as s:
        conv = conversations.get_or_create(s, session_key="slack:C1:t", channel="slack", chat_id="C1")
        for thread in ("t1", "t2"):
            s.add(Message(conversation_id=conv.id, role=Role.USER, content="hi", meta={"origin": {
                "channel": "slack", "chat_id": "C1", "reply_meta": {"thread_ts": thread}}}))
            s.flush()
        assert heartbeat.target(s) == {"channel": "slack", "chat_id": "C1", "reply_meta": {"thread_ts": "t2"}}


def test_a_skip_decision_costs_one_call_and_no_run(core: Core, fake_llm: FakeLLM) -> None:
    stack, rt, _ = core()
    (stack.workspace / "HEARTBEAT.md").write_text("- water the plants on Sundays\n")
    fake_llm.handler = decide_with("SKIP")
    assert heartbeat.beat(rt) == []
    assert fake_llm.calls() == 1 and runs(stack) == []


def test_the_heartbeat_session_is_trimmed(core: Core) -> None:
    stack, _, _ = core()
    with db(stack) as s:
        conv = conversations.get_or_create(s, session_key=heartbeat.SESSION, channel="internal")
        s.add_all(Message(conversation_id=conv.id, role=Role.USER, content=f"m{i}") for i in range(50))
        s.flush()
        heartbeat.trim(s, conv.id)
        kept = s.exec(select(Message.content).where(Message.conversation_id == conv.id)
                      .order_by(col(Message.seq))).all()
        assert kept == [f"m{i}" for i in range(30, 50)]
        assert s.exec(select(func.count()).select_from(Message)).one() == heartbeat.KEEP_MESSAGES


def test_heartbeat_tasks_ignore_headings_comments_and_empty_items() -> None:
    assert heartbeat.tasks("# T\n\n<!-- a\nb -->\n- [ ]\n* \n") == ""
    assert heartbeat.tasks("# T\n- [ ] call mum\n") == "- [ ] call mum"
    assert heartbeat.tasks("Tasks\n=====\n1. [ ]\n2) \n---\n") == ""  # a setext heading, numbered items, a rule
    assert heartbeat.tasks("Tasks\n-----\n- check backups\n---\n") == "- check backups"  # an item before a rule


@pytest.mark.parametrize(("answer", "quiet"), [
    ("HEARTBEAT_OK", True), (" **heartbeat_ok.** ", True),
    ("HEARTBEAT_OK for most tasks, but the backup FAILED: disk full", False), ("All fine. HEARTBEAT_OK", False),
])
def test_only_a_bare_heartbeat_ok_is_quiet(answer: str, quiet: bool) -> None:
    """A model adds to the token: an answer that starts with it may still carry an alert."""
    assert cron.quiet(Run(conversation_id="c", final_text=answer)) is quiet


def decisions(fake_llm: FakeLLM) -> int:
    return sum("Answer RUN or SKIP" in str(r["messages"][-1].get("content")) for r in fake_llm.requests)


def test_a_heartbeat_is_decided_once_however_often_it_comes(sched: Stack, fake_llm: FakeLLM) -> None:
    """The same message again (redelivered after a worker died) is not decided again, nor is
    another heartbeat within half an interval of it (a beat that lost its lock sends one again)."""
    stack, app = sched, make_celery(sched.settings)
    (stack.workspace / "HEARTBEAT.md").write_text("- water the plants on Sundays\n")
    fake_llm.handler = decide_with("SKIP")
    worker = stack.procs[-1]

    def done(task_id: str, times: int = 1) -> bool:
        return worker.log().count(f"{T_HEARTBEAT}[{task_id}] succeeded") >= times

    app.send_task(T_HEARTBEAT, task_id="late-beat")
    wait_until(lambda: done("late-beat"), message="the late heartbeat")
    app.send_task(T_HEARTBEAT, task_id="late-beat")
    app.send_task(T_HEARTBEAT, task_id="next-beat")
    wait_until(lambda: done("late-beat", 2) and done("next-beat"), message="the replay and the next heartbeat")
    assert decisions(fake_llm) == 1


def test_a_failed_decision_is_tried_again(sched: Stack, fake_llm: FakeLLM) -> None:
    stack = sched
    (stack.workspace / "HEARTBEAT.md").write_text("- check the deploy\n" + call("record", tag="hb") + "\n")
    failures = iter(range(3))  # the decision call and both of its own retries (LLM__MAX_RETRIES=2)

    def handler(body: dict[str, Any]) -> Reply:
        if "Answer RUN or SKIP" in str(body["messages"][-1].get("content")) and next(failures, None) is not None:
            return Reply(status=503)
        return decide_with("RUN")(body)

    fake_llm.handler = handler
    Producer(make_celery(stack.settings)).send(T_HEARTBEAT)
    wait_until(lambda: [r for r in runs(stack, kind=RunKind.HEARTBEAT) if r.status == RunStatus.SUCCEEDED],
               timeout=60, message="the heartbeat's run, after its decision was retried")
    assert decisions(fake_llm) == 4 and stack.executions()[0].endswith(" hb")


def test_a_heartbeat_file_linked_out_of_the_workspace_is_not_read(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """HEARTBEAT.md is read as read_file reads: a planted `ln -s /etc/shadow HEARTBEAT.md` would
    otherwise send the file to the LLM as the tasks to decide on."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (tmp_path / "secret.txt").write_text("- root:$6$hash:19000:0:99999:7:::\n")
    (workspace / heartbeat.FILE).symlink_to(tmp_path / "secret.txt")
    rt = Runtime.build(load_settings(workspace=workspace))
    with caplog.at_level(logging.WARNING, logger="shared.scheduling.heartbeat"):
        assert heartbeat.read(rt) == ""
    assert any("outside the workspace" in r.getMessage() for r in caplog.records)
    (workspace / heartbeat.FILE).unlink()
    assert heartbeat.read(rt) == ""  # missing: nothing to do, nothing to say
    (workspace / heartbeat.FILE).write_text("- [ ] water the plants\n" + "- [ ] x\n" * 10_000)
    with caplog.at_level(logging.WARNING, logger="shared.scheduling.heartbeat"):
        assert heartbeat.read(rt).startswith("- [ ] water the plants")
    assert any("longer than" in r.getMessage() for r in caplog.records)
