"""/new on real Postgres, in-process: the cut is made at once, its summary is written by the
compaction task whatever runs beside it, sent again by the sweep, and given up in the end."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlmodel import Session

from shared.agent import conversations, memory, prompt, service, views
from shared.agent.runtime import Runtime
from shared.db import get_engine
from shared.llm_types import LLMError, LLMResponse
from shared.models import IMAGES, Message, Role, utcnow
from tests.fakes.llm import FakeLLM
from tests.support.stack import Stack


def _chat(rt: Runtime, exchanges: int) -> str:
    with rt.session() as s:
        cid = conversations.get_or_create(s, session_key=f"api:{utcnow().timestamp()}").id
        for i in range(exchanges):
            s.add(Message(conversation_id=cid, role=Role.USER, content=f"question {i}"))
            s.add(Message(conversation_id=cid, role=Role.ASSISTANT, content=f"answer {i}"))
    return cid


def _summary(rt: Runtime, cid: str) -> Message:
    with rt.session() as s:
        found = prompt.latest_summary(s, cid)
        assert found is not None
        return found


def _new(rt: Runtime, cid: str) -> None:
    with rt.session() as s:
        memory.start_over(s, cid)


def test_an_automatic_compaction_overtaken_by_new_leaves_the_new_bounds(stack: Stack) -> None:
    """A /new while an automatic compaction waits for its model: the compaction's result is dropped
    (its write would have moved the cut back), and the /new summary then covers everything."""
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 30)  # 60 messages: 40 past the window of 20
    complete = rt.llm.complete

    def new_meanwhile(*args: Any, **kwargs: Any) -> Any:
        _new(rt, cid)
        return complete(*args, **kwargs)

    rt.llm.complete = new_meanwhile  # type: ignore[method-assign]
    assert memory.compact(rt, cid) is False
    due = _summary(rt, cid)
    assert memory.DUE in due.meta and due.content == "" and due.meta[memory.FROM] == 0
    rt.llm.complete = complete  # type: ignore[method-assign]
    assert memory.compact(rt, cid, everything=True) is True
    done = _summary(rt, cid)
    assert memory.DUE not in done.meta and done.meta[prompt.COVERS] == due.meta[prompt.COVERS]
    assert "answer 29" in done.content  # the fake's summary quotes the end of what it was given
    assert memory.compact(rt, cid, everything=True) is False  # a second task finds nothing due


def test_a_second_new_extends_the_due_summary(stack: Stack) -> None:
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 2)
    _new(rt, cid)
    first = _summary(rt, cid).meta
    with rt.session() as s:
        s.add(Message(conversation_id=cid, role=Role.USER, content="after the first /new"))
    _new(rt, cid)
    second = _summary(rt, cid).meta
    assert second[memory.FROM] == first[memory.FROM] == 0 and second[prompt.COVERS] > first[prompt.COVERS]
    assert second[memory.ASKED] > first[memory.ASKED]  # the hour before giving up counts from the latest /new
    assert memory.compact(rt, cid, everything=True) is True
    done = _summary(rt, cid)
    assert "after the first /new" in done.content and memory.DUE not in done.meta


def test_a_new_summary_the_model_cannot_write_is_left_to_the_sweep_then_given_up(stack: Stack) -> None:
    """A failed /new summary is stamped due now, so the sweep sends it again after a grace: the
    sweep is its only re-sender (task retries beside it piled up calls during an outage)."""
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 2)
    _new(rt, cid)
    sent = _summary(rt, cid).meta[memory.DUE]

    def down(*args: Any, **kwargs: Any) -> Any:
        raise LLMError("the model is down", user_message="down")

    rt.llm.complete = down  # type: ignore[method-assign]
    assert memory.compact(rt, cid, everything=True) is False
    assert _summary(rt, cid).meta[memory.DUE] > sent
    with Session(get_engine(stack.settings.database_url)) as s:
        summary = s.get_one(Message, _summary(rt, cid).id)
        summary.meta = {**summary.meta, memory.ASKED: (utcnow() - memory.GIVE_UP - timedelta(minutes=1)).isoformat()}
        s.add(summary)
        s.commit()
    assert memory.compact(rt, cid, everything=True) is False
    given_up = _summary(rt, cid)
    assert memory.DUE not in given_up.meta and given_up.content == ""
    with rt.session() as s:  # the cut stays: the new session does not see the old messages
        assert prompt.history(s, cid, 20) == (given_up, [])


def test_the_sweep_resends_a_due_summary_once_per_grace_and_not_while_one_is_written(stack: Stack) -> None:
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 1)
    _new(rt, cid)
    assert memory.resend_summaries(rt) == []  # just sent by /new itself
    with Session(get_engine(stack.settings.database_url)) as s:
        s.execute(text("update messages set meta = jsonb_set(meta, '{summary_due}',"
                       " to_jsonb(now() - interval '1 hour')) where type = 'SUMMARY'"))
        s.commit()
    with rt.session() as s:  # a compaction is writing it
        s.execute(text("update conversations set compacting_until = now() + interval '1 minute'"))
    assert memory.resend_summaries(rt) == []
    with rt.session() as s:
        s.execute(text("update conversations set compacting_until = null"))
    assert memory.resend_summaries(rt) == [cid]
    assert memory.resend_summaries(rt) == []  # stamped: left alone for another grace


def test_a_backlog_too_long_for_the_model_is_summarised_from_its_newest_part(
        stack: Stack, fake_llm: FakeLLM) -> None:
    """Compactions that failed for a while, or a small model, leave more history than one request
    can hold: the summary request is cut to what fits the context window (it was sent whole, refused
    by the provider after every turn, and the summary never moved on)."""
    llm = stack.settings.llm.model_copy(update={"context_window": 3000, "max_tokens": 500})
    rt = Runtime.build(stack.settings.model_copy(update={"llm": llm}))
    with rt.session() as s:
        cid = conversations.get_or_create(s, session_key="api:backlog").id
        for i in range(150):
            s.add(Message(conversation_id=cid, role=Role.USER, content=f"note {i}: " + "words " * 150))
    assert memory.compact(rt, cid) is True
    with fake_llm.lock:
        [request] = [b["messages"] for b in fake_llm.requests if "Summarise the conversation" in json.dumps(b)]
    assert rt.llm.count_tokens(request) <= 2500
    sent = request[0]["content"]
    assert "note 129:" in sent and "note 0:" not in sent  # the newest of what the window no longer shows
    summary = _summary(rt, cid)
    with rt.session() as s:  # all 130 are behind it
        after = prompt.history(s, cid, 50)
    assert after[0] is not None and after[0].id == summary.id
    assert [m.content.split(":")[0] for m in after[1]] == [f"note {i}" for i in range(130, 150)]


@pytest.mark.parametrize(("gateway", "worker"), [(-1, -1), (0, 2)], ids=["clocks-behind", "worker-ahead"])
def test_a_new_summary_is_timed_on_postgres_clock(stack: Stack, monkeypatch: pytest.MonkeyPatch,
                                                  gateway: int, worker: int) -> None:
    """/new stamps its summary due, and a failed summary stamps it again: the sweep sends it again a
    grace later, and it is given up an hour after the /new, on Postgres's clock. Stamped on clocks an
    hour behind, it was sent again at once, beside the task just sent; on a worker's clock two hours
    ahead of the gateway's, it was given up at its first failure."""
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 2)

    def clock(hours: int) -> None:  # the process's clock, `hours` off Postgres's
        monkeypatch.setattr(memory, "utcnow", lambda: datetime.now(UTC) + timedelta(hours=hours), raising=False)

    def down(*args: Any, **kwargs: Any) -> Any:
        raise LLMError("the model is down", user_message="down")

    clock(gateway)
    _new(rt, cid)
    clock(worker)
    rt.llm.complete = down  # type: ignore[method-assign]
    assert memory.compact(rt, cid, everything=True) is False
    assert memory.DUE in _summary(rt, cid).meta  # not given up
    assert memory.resend_summaries(rt) == []  # due again a grace from now


def test_a_summary_is_told_of_the_photos_it_is_not_shown(stack: Stack, fake_llm: FakeLLM) -> None:
    rt = Runtime.build(stack.settings)
    with rt.session() as s:
        cid = conversations.get_or_create(s, session_key=f"api:photos:{utcnow().timestamp()}").id
        s.add(Message(conversation_id=cid, role=Role.USER, content="", meta={IMAGES: 2}))  # photos alone
        s.add(Message(conversation_id=cid, role=Role.USER, content="my cat", meta={IMAGES: 1}))
        s.add(Message(conversation_id=cid, role=Role.ASSISTANT, content="a fine cat"))
    fake_llm.reset()
    _new(rt, cid)
    assert memory.compact(rt, cid, everything=True) is True
    with fake_llm.lock:
        [request] = [b["messages"] for b in fake_llm.requests if "Summarise the conversation" in json.dumps(b)]
    assert "USER: [2 photo(s)]\nUSER: [1 photo(s)] my cat\nASSISTANT: a fine cat" in request[0]["content"]


def test_an_empty_summary_from_the_model_keeps_the_one_there_is(stack: Stack) -> None:
    """The model answered a compaction with nothing: stored, the empty text replaced the summary, and
    the next compaction had no previous summary to build on: the conversation's memory was gone."""
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 30)
    assert memory.compact(rt, cid) is True
    kept = _summary(rt, cid).content
    with rt.session() as s:
        for i in range(30, 60):
            s.add(Message(conversation_id=cid, role=Role.USER, content=f"question {i}"))
            s.add(Message(conversation_id=cid, role=Role.ASSISTANT, content=f"answer {i}"))
    complete = rt.llm.complete

    def nothing(*args: Any, **kwargs: Any) -> LLMResponse:
        return dataclasses.replace(complete(*args, **kwargs), content=" \n")

    rt.llm.complete = nothing  # type: ignore[method-assign]
    assert memory.compact(rt, cid) is False
    assert _summary(rt, cid).content == kept and "answer 19" in kept
    _new(rt, cid)  # a /new summary the model leaves empty is left to the sweep, as a failed one
    assert memory.compact(rt, cid, everything=True) is False
    assert _summary(rt, cid).content == kept and memory.DUE in _summary(rt, cid).meta


def test_new_while_a_turn_runs_is_refused_and_cuts_nothing(stack: Stack) -> None:
    """The running turn's answer, written after a cut made now, opened the new session without its
    question (and the old session's summary went without it)."""
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 2)
    with rt.session() as s:
        turn = conversations.post_message(s, cid, "a long question", origin={"channel": "api", "chat_id": cid},
                                          lease_seconds=2).run_id
    assert turn is not None
    with rt.session() as s:
        refused = service.submit(rt, s, cid, "/new", origin={"channel": "api", "chat_id": cid})
    assert refused.reply == service.NEW_WHILE_BUSY and refused.nexts == []
    with rt.session() as s:
        assert prompt.latest_summary(s, cid) is None
        s.execute(text("update conversations set active_run_id = null where id = :cid"), {"cid": cid})  # it ended
    with rt.session() as s:
        started = service.submit(rt, s, cid, "/new", origin={"channel": "api", "chat_id": cid})
    assert started.reply is not None and started.reply.startswith("Started a new session")


def test_a_summary_not_written_yet_is_not_listed(stack: Stack) -> None:
    """GET .../messages showed a SYSTEM SUMMARY with no text while the model wrote it (or kept failing)."""
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 2)
    _new(rt, cid)
    with rt.session() as s:
        assert [m["type"] for m in views.messages(s, cid)] == ["NORMAL"] * 4
    assert memory.compact(rt, cid, everything=True) is True
    with rt.session() as s:
        listed = views.messages(s, cid)
    assert [m["type"] for m in listed] == ["NORMAL"] * 4 + ["SUMMARY"] and "answer 1" in listed[-1]["content"]
