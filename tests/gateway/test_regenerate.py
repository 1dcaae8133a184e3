"""Answering the last message again, through the API (POST .../regenerate, optionally edited) and
in a chat (/retry), with a real worker: the old answer and its tool results go, the message moves to
the end of the transcript, and one new turn answers it."""

from __future__ import annotations

import functools
from typing import Any

from sqlmodel import Session

from shared.constants import REPORT
from shared.db import get_engine
from shared.models import TERMINAL, Message, Role, RunStatus
from tests.fakes.llm import FakeLLM
from tests.support.processes import wait_until
from tests.support.stack import Stack


def _run(api: Any, run_id: str) -> dict[str, Any] | None:
    run: dict[str, Any] = api.get(f"/api/v1/runs/{run_id}").json()
    return run if RunStatus(run["status"]) in TERMINAL else None


def _ended(api: Any, run_id: str) -> dict[str, Any]:
    run = wait_until(functools.partial(_run, api, run_id), timeout=30, message=f"run {run_id} to end")
    assert isinstance(run, dict)
    return run


def _transcript(api: Any, cid: str) -> list[tuple[str, str]]:
    rows = api.get(f"/api/v1/conversations/{cid}/messages").json()
    return [(m["role"], m["content"]) for m in rows if m["type"] == "NORMAL"]


def test_regenerate_answers_the_last_message_again_and_drops_the_old_answer(stack: Stack, api: Any,
                                                                            fake_llm: FakeLLM) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    first = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "hello"}).json()
    asked = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "call:time"}).json()
    assert asked["assistantMessage"].startswith("done: ") and len(asked["toolCalls"]) == 1
    before = api.get(f"/api/v1/conversations/{cid}/messages").json()

    again = api.post(f"/api/v1/conversations/{cid}/regenerate")
    assert again.status_code == 202, again.text
    body = again.json()
    assert body["runId"] not in (first["runId"], asked["runId"])
    run = _ended(api, body["runId"])
    assert run["status"] == RunStatus.SUCCEEDED and run["result"].startswith("done: ")
    rows = api.get(f"/api/v1/conversations/{cid}/messages").json()
    assert [(m["role"], m["content"]) for m in rows][:2] == [("USER", "hello"), ("ASSISTANT", "echo: hello")]
    assert [m["role"] for m in rows[2:]] == ["USER", "ASSISTANT", "TOOL", "ASSISTANT"]  # one answer, not two
    moved = rows[2]
    assert moved["id"] == body["messageId"] and moved["content"] == "call:time"
    assert moved["seq"] > max(m["seq"] for m in before)  # a follower with ?after= sees it again
    assert not ({m["id"] for m in before[3:]} & {m["id"] for m in rows})  # the old answer and tool result went
    assert api.get(f"/api/v1/runs/{asked['runId']}").json()["result"] == asked["assistantMessage"]  # kept there

    edited = api.post(f"/api/v1/conversations/{cid}/regenerate", json={"message": "no tools this time"})
    assert edited.status_code == 202
    _ended(api, edited.json()["runId"])
    assert _transcript(api, cid)[2:] == [("USER", "no tools this time"), ("ASSISTANT", "echo: no tools this time")]
    with fake_llm.lock:
        last = fake_llm.requests[-1]["messages"]
    assert "call:time" not in str(last) and "done: " not in str(last)  # the model saw the edit alone


def test_regenerate_is_refused_while_a_turn_runs_and_with_nothing_to_answer(stack: Stack, api: Any) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    empty = api.post(f"/api/v1/conversations/{cid}/regenerate")
    assert empty.status_code == 409 and "no message yet" in empty.json()["detail"]
    slow = api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "sleep:2"}).json()
    busy = api.post(f"/api/v1/conversations/{cid}/regenerate")
    assert busy.status_code == 409 and slow["runId"] in busy.text
    _ended(api, slow["runId"])
    assert api.post("/api/v1/conversations/nope/regenerate").status_code == 404
    bad = api.post(f"/api/v1/conversations/{cid}/regenerate", json={"message": ""})
    assert bad.status_code == 422
    assert api.post(f"/api/v1/conversations/{cid}/regenerate", json={"text": "x"}).status_code == 422
    assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/new"}).status_code == 200
    summarised = api.post(f"/api/v1/conversations/{cid}/regenerate")
    assert summarised.status_code == 409 and "since its last summary" in summarised.json()["detail"]


def test_retry_in_a_chat_answers_the_last_message_again(stack: Stack, api: Any) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    nothing = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/retry"}).json()
    assert nothing["assistantMessage"] == "Nothing to retry: the conversation has no message yet."
    api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "one"})
    retried = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/retry"}).json()
    assert retried["assistantMessage"] == "echo: one" and retried["runId"]
    assert _transcript(api, cid) == [("USER", "one"), ("ASSISTANT", "echo: one")]
    edited = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/retry  one, but\nin two lines"})
    assert edited.json()["assistantMessage"] == "echo: one, but\nin two lines"
    assert _transcript(api, cid) == [("USER", "one, but\nin two lines"), ("ASSISTANT", "echo: one, but\nin two lines")]


def test_regenerate_answers_the_user_s_message_and_keeps_what_came_from_elsewhere(stack: Stack, api: Any) -> None:
    """A subagent's report (a user message of the conversation) and a cron job's result came after the
    user's last message and its answer: /retry answered the report again, and dropped the cron result
    and everything else after the message, not the answer alone."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "question one"})
    with Session(get_engine(stack.settings.database_url)) as s:
        s.add(Message(conversation_id=cid, role=Role.USER, content="[subagent report] it is done",
                      meta={"kind": REPORT}, run_id="run-of-the-report"))
        s.add(Message(conversation_id=cid, role=Role.ASSISTANT, content="your task is done",
                      run_id="run-of-the-report"))
        s.add(Message(conversation_id=cid, role=Role.ASSISTANT, content="[cron] the daily check passed"))
        s.commit()
    again = api.post(f"/api/v1/conversations/{cid}/regenerate").json()
    _ended(api, again["runId"])
    assert _transcript(api, cid) == [
        ("USER", "[subagent report] it is done"), ("ASSISTANT", "your task is done"),
        ("ASSISTANT", "[cron] the daily check passed"), ("USER", "question one"), ("ASSISTANT", "echo: question one")]
