"""`nanofleet agent` in-process: it finishes what a crashed earlier call left, reports subagents,
runs what a command starts, and says when a turn failed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlmodel import col, select

from gateway.local_agent import Answer, one_turn
from shared.agent import conversations, prompt, steps
from shared.agent.local import drain
from shared.agent.runtime import Runtime
from shared.agent.service import submit
from shared.agent.steps import FAILED_STEP
from shared.constants import T_TOOL_EXECUTE
from shared.models import Message, MessageType, Run, RunKind, RunStatus, utcnow
from shared.settings import Settings, load_settings
from tests.fakes.llm import FakeLLM, Reply, default_handler
from tests.support.processes import wait_until
from tests.support.stack import clean_db


def _settings(database_url: str, fake_llm: FakeLLM, workspace: Path) -> Settings:
    return load_settings(database_url=database_url, workspace=workspace,
                         llm={"model": "openai/fake-model", "api_base": fake_llm.url, "api_key": "sk-x"},
                         tools={"allowed": ["time", "spawn"]})


def test_a_turn_left_by_a_crashed_call_is_finished_first(database_url: str, fake_llm: FakeLLM,
                                                         tmp_path: Path) -> None:
    clean_db(database_url)
    fake_llm.reset()
    settings = _settings(database_url, fake_llm, tmp_path)
    rt = Runtime.build(settings)
    with rt.session() as s:  # an earlier call stored its message and run, then died before any step
        conv = conversations.get_or_create(s, session_key="cli:t", channel="cli", chat_id="cli:t")
        stale = submit(rt, s, conv.id, "first", origin={"channel": "api", "chat_id": "cli:t"})
    with rt.session() as s:
        run = s.get_one(Run, stale.run_id)
        run.lease_until = utcnow() - timedelta(seconds=1)
        s.add(run)
    # the answer the earlier call never printed comes first
    assert one_turn(settings, message="second", session="cli:t").text == "echo: first\n\necho: second"
    with rt.session() as s:
        assert s.get_one(Run, stale.run_id).final_text == "echo: first"


def test_a_turn_whose_call_died_in_a_tool_is_finished_first(database_url: str, fake_llm: FakeLLM,
                                                             tmp_path: Path) -> None:
    """The sweep gives a tool call one more lease before it takes it for dead: a single sweep left
    the turn going and the new message queued behind it (helper's review)."""
    clean_db(database_url)
    fake_llm.reset()
    settings = _settings(database_url, fake_llm, tmp_path)
    rt = Runtime.build(settings)
    with rt.session() as s:
        conv = conversations.get_or_create(s, session_key="cli:k", channel="cli", chat_id="cli:k")
        stale = submit(rt, s, conv.id, "call:time {}", origin={"channel": "api", "chat_id": "cli:k"})
    [tool] = steps.llm_step(rt, stale.run_id, 0)  # the earlier call asked for the tool...
    with rt.session() as s:  # ...claimed it, and died in it
        s.execute(text("update tool_calls set status = 'RUNNING', started_at = now() - interval '1 minute'"))
        s.execute(text("update runs set lease_until = now() - interval '1 second' where id = :r"), {"r": stale.run_id})
    assert tool.task == T_TOOL_EXECUTE
    answer = one_turn(settings, message="second", session="cli:k")
    assert answer.ok and answer.text.startswith("done: ") and answer.text.endswith("\n\necho: second")
    with rt.session() as s:
        assert s.get_one(Run, stale.run_id).status == RunStatus.SUCCEEDED  # told the tool may not have run


def test_a_subagent_reports_before_the_call_returns(database_url: str, fake_llm: FakeLLM, tmp_path: Path) -> None:
    clean_db(database_url)
    fake_llm.reset()
    settings = _settings(database_url, fake_llm, tmp_path)
    answer = one_turn(settings, message='call:spawn {"task": "count the stars"}', session="cli:s").text
    # inline, the subagent ends before the turn's next step, which takes its report in (steer)
    assert "subagent report" in answer and "echo: count the stars" in answer
    with Runtime.build(settings).session() as s:
        [child] = s.exec(select(Run).where(Run.kind == RunKind.SUBAGENT)).all()
        assert child.status == RunStatus.SUCCEEDED and child.announced


def test_new_summarises_and_a_failed_turn_says_so(database_url: str, fake_llm: FakeLLM, tmp_path: Path) -> None:
    clean_db(database_url)
    fake_llm.reset()
    settings = _settings(database_url, fake_llm, tmp_path)
    assert one_turn(settings, message="remember the tea", session="cli:n").ok
    new = one_turn(settings, message="/new", session="cli:n")
    assert new.ok and new.text.startswith("Started a new session")
    with Runtime.build(settings).session() as s:  # /new's summary was written before the call returned
        [summary] = s.exec(select(Message).where(Message.type == MessageType.SUMMARY)).all()
        assert "remember the tea" in summary.content
    fake_llm.handler = lambda body: Reply(status=400)
    failed = one_turn(settings, message="anything", session="cli:n")
    assert not failed.ok and "refused" in failed.text


def test_a_new_summary_the_model_could_not_write_is_sent_again_by_a_later_call(
        database_url: str, fake_llm: FakeLLM, tmp_path: Path) -> None:
    """`nanofleet agent -m /new` with the model down: no traceback, the new session starts, and the
    summary is written by a later call (its sweep of the conversation sends it again; it used to
    send it never, and compaction stayed off for good)."""
    clean_db(database_url)
    fake_llm.reset()
    settings = _settings(database_url, fake_llm, tmp_path)
    settings = settings.model_copy(update={"runtime": settings.runtime.model_copy(update={"requeue_grace": 0.2})})
    assert one_turn(settings, message="remember the tea", session="cli:d").ok
    fake_llm.handler = lambda body: Reply(status=400)  # refused: not retried
    assert one_turn(settings, message="/new", session="cli:d").text.startswith("Started a new session")
    rt = Runtime.build(settings)

    def summary() -> Message:
        with rt.session() as s:
            [found] = s.exec(select(Message).where(Message.type == MessageType.SUMMARY)).all()
            return found

    assert "summary_due" in summary().meta and summary().content == ""
    fake_llm.handler = default_handler
    deadline = utcnow() + timedelta(seconds=30)
    while "summary_due" in summary().meta and utcnow() < deadline:  # each call sweeps its conversation
        assert one_turn(settings, message="and now?", session="cli:d").ok
    assert "remember the tea" in summary().content and "summary_due" not in summary().meta


def test_a_step_that_raises_is_tried_again_inline(database_url: str, fake_llm: FakeLLM, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """There is no sweeper to send a failed step again: the call crashed with a traceback and left
    the turn for a later one."""
    clean_db(database_url)
    fake_llm.reset()
    settings = _settings(database_url, fake_llm, tmp_path)
    build, raised = prompt.build, []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if len(raised) < 2:
            raised.append(1)
            raise RuntimeError("a bug on the first two tries")
        return build(*args, **kwargs)

    monkeypatch.setattr(prompt, "build", flaky)
    assert one_turn(settings, message="hello", session="cli:f") == Answer("echo: hello")
    monkeypatch.setattr(prompt, "build", lambda *args, **kwargs: 1 / 0)
    failed = one_turn(settings, message="again", session="cli:f")
    assert failed == Answer(FAILED_STEP, ok=False)


def test_a_message_queued_behind_another_calls_turn_gets_its_answer(database_url: str, fake_llm: FakeLLM,
                                                                    tmp_path: Path) -> None:
    """It printed "(your message is queued behind a running turn)" and exited 1; the other call printed
    the answer."""
    clean_db(database_url)
    fake_llm.reset()
    settings = _settings(database_url, fake_llm, tmp_path)
    rt = Runtime.build(settings)
    with rt.session() as s:  # another call's turn, going
        conv = conversations.get_or_create(s, session_key="cli:q", channel="cli", chat_id="cli:q")
        other = submit(rt, s, conv.id, "first", origin={"channel": "api", "chat_id": "cli:q"})
    with rt.session() as s:  # its call renews the lease
        s.execute(text("update runs set lease_until = now() + interval '1 hour' where id = :r"), {"r": other.run_id})
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(one_turn, settings, message="second", session="cli:q")
        wait_until(lambda: "second" in pending(rt, conv.id), timeout=30, message="the message to wait")
        drain(rt, other.nexts)  # the other call's step takes it in (steer) and answers
        assert queued.result(timeout=30) == Answer("echo: second")


def pending(rt: Runtime, conversation_id: str) -> list[str]:
    with rt.session() as s:
        return list(s.exec(select(Message.content).where(Message.conversation_id == conversation_id,
                                                         col(Message.pending))).all())


def test_two_calls_on_one_session_each_print_their_own_answer(database_url: str, fake_llm: FakeLLM,
                                                              tmp_path: Path) -> None:
    """The first call ran the turn of the second's message (it waited behind the first's turn) and
    printed that answer too, and took its exit status."""
    clean_db(database_url)
    fake_llm.reset()
    settings = _settings(database_url, fake_llm, tmp_path)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(one_turn, settings, message="sleep:2 one", session="cli:two")
        wait_until(lambda: fake_llm.in_flight > 0, timeout=30, message="the first call's turn")
        second = pool.submit(one_turn, settings, message="two", session="cli:two")
        assert first.result(timeout=60) == Answer("echo: sleep:2 one")
        assert second.result(timeout=60) == Answer("echo: two")
