"""Subagents end to end: gateway in-process, a real worker process, fake LLM over HTTP (crashes and
restarts: test_restarts.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlmodel import select

from shared.agent import conversations
from shared.agent.runtime import Runtime
from shared.agent.service import submit
from shared.constants import REPORT
from shared.models import Message, Role, RunStatus, ToolCall, ToolStatus
from tests.fakes.llm import FakeLLM
from tests.support.processes import wait_until
from tests.support.scheduling import (
    assert_reported_once,
    call,
    child_of,
    client,
    db,
    new_conversation,
    reported,
    reports,
    runs,
    settled,
    spawn,
    subagents,
)
from tests.support.stack import Stack


def test_spawn_returns_at_once_and_the_report_arrives_once(sched: Stack) -> None:
    stack = sched
    with client(stack) as api:
        cid = new_conversation(api)
        [spawned] = spawn(api, cid, "sleep:1\n" + call("record", tag="sub"))
        child_id = child_of(spawned)
        assert json.loads(spawned["result"])["status"] == "started"
        wait_until(lambda: reported(stack, cid, child_id), timeout=60, message="the subagent's report")
    assert_reported_once(stack, cid, child_id, "sub")
    parent, child = runs(stack, conversation_id=cid)[0], next(iter(subagents(stack)))
    assert parent.finished_at and child.finished_at and parent.finished_at < child.finished_at
    assert child.parent_run_id == parent.id and child.label == "job0"
    assert child.max_iterations == stack.settings.subagents.max_iterations


def test_a_subagent_asking_for_a_tool_kept_from_it_is_refused_and_audited(sched: Stack) -> None:
    """The model is not offered `message`, `spawn` or `cron` in a subagent, and a call it makes all
    the same is refused; the refusal had no TOOL_AUDIT record (it never reached the registry)."""
    stack = sched
    with client(stack) as api:
        cid = new_conversation(api)
        [spawned] = spawn(api, cid, call("message", content="hi") + "\n" + call("time"))
        child_id = child_of(spawned)
        wait_until(lambda: reported(stack, cid, child_id), timeout=60, message="the subagent's report")
    with db(stack) as s:
        calls = {c.name: c for c in s.exec(select(ToolCall).where(ToolCall.run_id == child_id))}
    assert (calls["message"].status, calls["message"].result["error"]) == (ToolStatus.REJECTED, "NOT_ALLOWED")
    assert calls["time"].status == ToolStatus.SUCCESS
    worker = next(p for p in stack.procs if p.alive())

    def audited() -> list[str]:
        return [line for line in worker.log().splitlines() if "tool=" in line and f"run={child_id} " in line]

    wait_until(lambda: len(audited()) == 2, message="an audit record of each call")
    assert "tool=message status=REJECTED code=NOT_ALLOWED" in "\n".join(audited())


def test_concurrency_limit_and_stop(sched: Stack, fake_llm: FakeLLM) -> None:
    stack = sched
    with client(stack) as api:
        cid = new_conversation(api)
        calls = spawn(api, cid, *["sleep:8"] * 4)  # long enough to still be running at the /stop
        statuses = sorted(c["status"] for c in calls)
        assert statuses == ["REJECTED", "SUCCESS", "SUCCESS", "SUCCESS"]
        rejected = next(c for c in calls if c["status"] == "REJECTED")
        assert "limit 3" in rejected["result"] and rejected["errorCode"] == "NOT_ALLOWED"
        assert len(subagents(stack)) == 3
        r = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/stop"})
        assert r.json()["assistantMessage"] == "Stopped 3 running task(s)."
    assert {c.status for c in subagents(stack)} == {RunStatus.CANCELLED}
    wait_until(lambda: fake_llm.in_flight == 0, message="the cancelled subagents' LLM calls to return")
    assert reports(stack, cid) == []  # a stopped subagent sends no report
    assert {c.status for c in subagents(stack)} == {RunStatus.CANCELLED}


def test_a_report_waiting_for_a_stopped_turn_is_told_by_the_next(sched: Stack) -> None:
    """The subagent finished while its parent's turn ran; its report waited for that turn, which the
    user then stopped. /stop stops the turn, not the news: a next turn tells the report."""
    stack = sched
    with client(stack) as api:
        cid = new_conversation(api)
        api.post(f"/api/v1/conversations/{cid}/messages",
                 json={"message": call("spawn", task="quick", label="q") + "\nsleep:4"})  # each parent call: 4 s
        wait_until(lambda: any(m.pending for m in reports(stack, cid)), timeout=60,
                   message="the report to wait for the parent's turn")
        assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/stop"}).json()[
            "assistantMessage"] == "Stopped 1 running task(s)."
        wait_until(lambda: settled(stack, cid), timeout=60, message="a turn to tell the report")
        [report] = reports(stack, cid)
        told = next(r for r in runs(stack, conversation_id=cid) if r.id == report.run_id)
        assert told.status == RunStatus.SUCCEEDED and "[subagent report" in (told.final_text or "")


def test_stop_stops_a_turn_a_report_started(core: Callable[..., tuple[Stack, Runtime, Any]]) -> None:
    """A report that arrives in an idle chat starts a turn; stopped before its first step, the report
    stayed waiting, and the freed chat started another turn for it at once: /stop could not stop it."""
    stack, rt, _ = core()
    with db(stack) as s:
        conv = conversations.get_or_create(s, session_key="api:r", chat_id="r")
        s.add(Message(conversation_id=conv.id, role=Role.USER, content="[subagent report] done", pending=True,
                      meta={"kind": REPORT}))
        s.flush()
        run_id = conversations.try_start_turn(s, conv.id, origin={"channel": "api", "chat_id": conv.id},
                                              lease_seconds=2)
    with db(stack) as s:
        stopped = submit(rt, s, conv.id, "/stop", origin={"channel": "api", "chat_id": conv.id})
    assert stopped.reply == "Stopped 1 running task(s)." and stopped.nexts == []  # no next turn
    [run] = runs(stack, conversation_id=conv.id)
    [report] = reports(stack, conv.id)
    assert run.id == run_id and run.status == RunStatus.CANCELLED and (report.pending, report.run_id) == (False, run_id)
