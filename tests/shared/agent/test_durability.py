"""The runtime under pressure: iteration bound, /stop, the mailbox under concurrent posts,
compaction, and SIGKILL of the worker mid-turn."""

from __future__ import annotations

import itertools
import signal
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import redis
from sqlmodel import Session, col, select

from shared.agent import conversations, memory
from shared.agent.events import stream_key, watch_key
from shared.agent.finish import CUT_OFF, cancel
from shared.agent.runtime import Runtime
from shared.constants import T_TOOL_EXECUTE
from shared.db import get_engine
from shared.models import Message, MessageType, Phase, Role, Run, ToolCall
from tests.fakes.llm import FakeLLM, Reply, default_handler
from tests.support.processes import Proc, wait_until
from tests.support.stack import Stack, api_client


def _runs(stack: Stack) -> list[Run]:
    with Session(get_engine(stack.settings.database_url)) as s:
        return list(s.exec(select(Run).order_by(col(Run.created_at))))


def _a_tool_running(stack: Stack) -> bool:
    with Session(get_engine(stack.settings.database_url)) as db:
        return any(c.status == "RUNNING" for c in db.exec(select(ToolCall)).all())


def _tool_statuses_are(api: Any, run_id: str, statuses: list[str]) -> bool:
    return [c["status"] for c in api.get(f"/api/v1/runs/{run_id}").json()["toolCalls"]] == statuses


def _task_ended(worker: Proc, task: str) -> bool:
    return any(f"{task}[" in line and "succeeded" in line for line in worker.log().splitlines())


def test_iteration_bound_gives_a_clear_message(make_stack: Callable[..., Stack], fake_llm: FakeLLM) -> None:
    s = make_stack(AGENT__MAX_ITERATIONS="3")
    s.worker()
    fake_llm.handler = lambda body: Reply(tool_calls=[("time", {})])  # never stops asking
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "loop"}).json()
        assert "stopped after 3 steps" in body["assistantMessage"]
        assert len(body["toolCalls"]) == 3 and fake_llm.calls() == 3


def test_a_message_sent_during_the_last_allowed_step_gets_its_own_turn(make_stack: Callable[..., Stack],
                                                                       fake_llm: FakeLLM) -> None:
    s = make_stack(AGENT__MAX_ITERATIONS="1")
    s.worker()
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        first = api.post(f"/api/v1/conversations/{cid}/messages",
                         json={"message": 'call:record {"tag": "t", "seconds": 2}'}).json()["runId"]
        wait_until(lambda: _a_tool_running(s), timeout=30, message="the tool to start")
        api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "late one"})
        wait_until(lambda: len([r for r in _runs(s) if r.status == "succeeded"]) == 2, timeout=30,
                   message="the bounded turn and a turn for the late message")
        assert "stopped after 1 steps" in api.get(f"/api/v1/runs/{first}").json()["result"]
        contents = [m["content"] for m in api.get(f"/api/v1/conversations/{cid}/messages").json()]
        assert contents[-2:] == ["late one", "echo: late one"]


def test_stop_cancels_the_running_turn(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    run_id = api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "sleep:3 slow"}).json()["runId"]
    wait_until(lambda: fake_llm.in_flight > 0, timeout=20, message="the LLM call to start")
    stop = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/stop"}).json()
    assert stop["assistantMessage"] == "Stopped 1 running task(s)."
    assert api.get(f"/api/v1/runs/{run_id}").json()["status"] == "cancelled"
    wait_until(lambda: fake_llm.in_flight == 0, timeout=20, message="the slow call to return")
    roles = [m["role"] for m in api.get(f"/api/v1/conversations/{cid}/messages").json()]
    assert roles == ["USER"]  # the late answer of a cancelled run is dropped
    # ... but what it cost is counted, once: the call was made and is paid for
    wait_until(lambda: api.get(f"/api/v1/runs/{run_id}").json()["steps"], timeout=20, message="the call's usage")
    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["usage"]["promptTokens"] > 0 and [s["seq"] for s in run["steps"]] == [0]
    assert api.get(f"/api/v1/conversations/{cid}").json()["usage"]["promptTokens"] == run["usage"]["promptTokens"]
    # the conversation is free again
    assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "again"}).json()[
        "assistantMessage"] == "echo: again"


def test_a_stopped_run_streams_no_text_after_its_end(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    """The model call of a stopped run goes on (it is not cut short); with a client watching, its text
    was published after the run's run.failed, to every reader of the stream."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    client = redis.Redis.from_url(stack.settings.redis_url, decode_responses=True)
    client.set(watch_key(cid), "1", ex=60)  # an SSE reader is there: the call streams
    posted = api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "sleep:2 a long answer"})
    run_id = posted.json()["runId"]
    wait_until(lambda: fake_llm.in_flight > 0, timeout=20, message="the LLM call to start")
    assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
    wait_until(lambda: api.get(f"/api/v1/runs/{run_id}").json()["steps"], timeout=30,
               message="the step to end (its call's usage recorded)")
    names = [f["event"] for _, f in client.xrange(stream_key(cid)) if run_id in f.get("data", "")]
    assert "run.failed" in names and "text.delta" not in names[names.index("run.failed"):], names


def test_a_chat_cancelled_during_a_tool_reports_how_the_call_ended(stack: Stack, api: Any) -> None:
    """The waiting /chat answers with the call's outcome (it was still RUNNING when the run ended:
    the cancel stops it within about a second), and the transcript the model reads next says the
    same, not that the outcome is unknown."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    answer: dict[str, Any] = {}

    def chat() -> None:
        answer.update(api.post(f"/api/v1/conversations/{cid}/chat",
                               json={"message": 'call:record {"tag": "t", "seconds": 20}'}).json())

    waiting = threading.Thread(target=chat)
    waiting.start()
    wait_until(lambda: _a_tool_running(stack), timeout=30, message="the tool to start")
    run_id = api.get(f"/api/v1/conversations/{cid}").json()["activeRunId"]
    assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
    waiting.join(30)
    assert answer["status"] == "cancelled"
    [call] = answer["toolCalls"]
    assert (call["status"], call["errorCode"]) == ("FAILED", "FAILED")
    assert call["result"] == "stopped: the run was cancelled while this call ran; it was cancelled"
    tool_messages = [m["content"] for m in api.get(f"/api/v1/conversations/{cid}/messages").json()
                     if m["role"] == "TOOL"]
    assert len(tool_messages) == 1 and "stopped: the run was cancelled while this call ran" in tool_messages[0]
    assert CUT_OFF not in tool_messages[0]


def test_mailbox_under_concurrent_posts(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    fake_llm.handler = lambda body: Reply(text="ok", delay=0.05)
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    n = 30
    barrier = threading.Barrier(n)

    def post(i: int) -> None:
        barrier.wait()
        assert api.post(f"/api/v1/conversations/{cid}/messages", json={"message": f"m{i}"}).status_code == 202

    threads = [threading.Thread(target=post, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def settled() -> bool:
        with Session(get_engine(stack.settings.database_url)) as s:
            pending = s.exec(select(Message).where(col(Message.pending).is_(True))).all()
            active = s.exec(select(Run).where(col(Run.status).in_(("queued", "running")))).all()
            return not pending and not active

    wait_until(settled, timeout=60, message="every message to be processed")
    with Session(get_engine(stack.settings.database_url)) as s:
        users = s.exec(select(Message).where(Message.role == Role.USER)).all()
        assert sorted(m.content for m in users) == sorted(f"m{i}" for i in range(n))
        assert all(m.run_id for m in users)  # each one went into a turn
    runs = sorted(_runs(stack), key=lambda r: r.started_at)  # type: ignore[arg-type, return-value]
    for a, b in itertools.pairwise(runs):
        assert a.finished_at <= b.started_at, "two turns of one conversation overlapped"  # type: ignore[operator]


def test_compaction_writes_a_summary_the_next_prompt_uses(make_stack: Callable[..., Stack],
                                                          fake_llm: FakeLLM) -> None:
    s = make_stack(MEMORY__WINDOW="4", MEMORY__COMPACT_AFTER="6")
    s.worker()
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        for i in range(5):
            api.post(f"/api/v1/conversations/{cid}/chat", json={"message": f"fact {i}"})

        def summary() -> Message | None:
            with Session(get_engine(s.settings.database_url)) as db:
                return db.exec(select(Message).where(Message.type == MessageType.SUMMARY)).first()

        found = wait_until(summary, timeout=30, message="a SUMMARY message")
        assert found.content.startswith("SUMMARY:")  # type: ignore[union-attr]
        api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "what do you remember?"})
        # The turn's request, not a compaction's that may have followed it (its one user message
        # quotes the transcript).
        turn = next(r["messages"] for r in reversed(fake_llm.requests)
                    if {"role": "user", "content": "what do you remember?"} in r["messages"])
        system = [m["content"] for m in turn if m["role"] == "system"]
        assert any("Summary of the earlier conversation" in c for c in system)
        history = [m for m in turn if m["role"] in ("user", "assistant")]
        assert len(history) <= 4 + 1  # the window plus the runtime context


def test_sigkill_mid_turn_loses_nothing_and_repeats_nothing(make_stack: Callable[..., Stack],
                                                            fake_llm: FakeLLM) -> None:
    """Kill the only worker while the second LLM call of a tool-using turn is in flight."""
    s = make_stack()
    first = s.worker()
    slow_after_tools = threading.Event()

    def handler(body: dict[str, Any]) -> Reply:
        reply = default_handler(body)
        if body["messages"][-2].get("role") == "tool" or body["messages"][-1].get("role") == "tool":
            slow_after_tools.set()
            reply.delay = 3.0
        return reply

    fake_llm.handler = handler
    s.beat()  # the sweeper
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        run_id = api.post(f"/api/v1/conversations/{cid}/messages",
                          json={"message": 'call:record {"tag": "a"}\ncall:record {"tag": "b"}'}).json()["runId"]
        wait_until(slow_after_tools.is_set, timeout=30, message="the LLM step after the tools")
        first.kill(signal.SIGKILL)
        s.worker()
        wait_until(lambda: api.get(f"/api/v1/runs/{run_id}").json()["status"] == "succeeded",  # noqa: B023
                   timeout=60, message="the run to complete on the new worker")
        assert sorted(line.split()[-1] for line in s.executions()) == ["a", "b"]
        msgs = api.get(f"/api/v1/conversations/{cid}/messages").json()
        assert [m["role"] for m in msgs] == ["USER", "ASSISTANT", "TOOL", "TOOL", "ASSISTANT"]
        with Session(get_engine(s.settings.database_url)) as db:
            assert all(c.attempts == 1 for c in db.exec(select(ToolCall)).all())


def test_sigkill_inside_a_tool_never_reruns_it_blind(make_stack: Callable[..., Stack]) -> None:
    """A non-idempotent tool interrupted mid-call is reported, not silently run again."""
    s = make_stack()
    first = s.worker()
    s.beat()
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        run_id = api.post(f"/api/v1/conversations/{cid}/messages",
                          json={"message": 'call:record {"tag": "slow", "seconds": 20}'}).json()["runId"]
        wait_until(lambda: _a_tool_running(s), timeout=30, message="the tool to start")
        first.kill(signal.SIGKILL)
        s.worker()
        wait_until(lambda: api.get(f"/api/v1/runs/{run_id}").json()["status"] == "succeeded",  # noqa: B023
                   timeout=60, message="the run to complete")
        call = api.get(f"/api/v1/runs/{run_id}").json()["toolCalls"][0]
        assert call["status"] == "FAILED" and "may or may not have taken effect" in call["result"]
        assert s.executions() == []  # killed before its side effect, and never re-run


def test_a_long_llm_call_keeps_its_lease(make_stack: Callable[..., Stack], fake_llm: FakeLLM) -> None:
    """A step that outlives the lease several times over is renewed, never re-run by the sweeper."""
    s = make_stack()  # lease 2 s, sweeper every 0.5 s
    s.worker()
    s.beat()
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "sleep:7 long one"}).json()
        assert body["assistantMessage"] == "echo: sleep:7 long one"
        assert fake_llm.calls() == 1


def test_a_slow_tool_keeps_its_lease_when_a_sibling_finishes(make_stack: Callable[..., Stack]) -> None:
    """Two tool calls of one step in one worker: the quick one ending must not stop the renewal of
    the slow one's lease, or the sweeper would report it interrupted while it still runs."""
    s = make_stack()  # lease 2 s, sweeper every 0.5 s
    s.worker()
    s.beat()
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        message = 'call:record {"tag": "slow", "seconds": 6}\ncall:record {"tag": "quick", "seconds": 0.5}'
        body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": message}).json()
        assert [c["status"] for c in body["toolCalls"]] == ["SUCCESS", "SUCCESS"], body["toolCalls"]
        assert sorted(line.split()[-1] for line in s.executions()) == ["quick", "slow"]


def test_followup_mode_runs_waiting_messages_as_the_next_turn(make_stack: Callable[..., Stack],
                                                               fake_llm: FakeLLM) -> None:
    s = make_stack(AGENT__MAILBOX_MODE="followup")
    s.worker()
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        first = api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "sleep:1.5 first"}).json()
        wait_until(lambda: fake_llm.in_flight > 0, timeout=20, message="the first turn's LLM call")
        second = api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "second"}).json()
        assert second["runId"] is None and second["queued"]

        def two_turns() -> bool:
            return len([r for r in _runs(s) if r.status == "succeeded"]) == 2

        wait_until(two_turns, timeout=30, message="both turns")
        contents = [m["content"] for m in api.get(f"/api/v1/conversations/{cid}/messages").json()]
        assert contents == ["sleep:1.5 first", "echo: sleep:1.5 first", "second", "echo: second"]
        assert first["runId"] != _runs(s)[-1].id


def _keep_a_worker_up(s: Stack, workers: list[Proc], done: Callable[[], bool]) -> None:
    """Start a new worker whenever the last one died, until `done` (compose's restart policy)."""
    def check() -> bool:
        if not workers[-1].alive():
            workers.append(s.worker(wait=False))  # it may pick up the deadly task before it is "ready"
        return done()
    wait_until(check, timeout=120, message="the run to end")


def test_a_tool_that_keeps_killing_its_worker_is_given_up_on(make_stack: Callable[..., Stack]) -> None:
    """An idempotent tool is re-run after its worker dies, but not forever: after max_recoveries
    the call fails with the reason and the turn goes on."""
    s = make_stack(RUNTIME__MAX_RECOVERIES="2", TOOLS__ALLOWED='["crash", "record"]')
    workers = [s.worker()]
    s.beat()
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        run_id = api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "call:crash {}"}).json()["runId"]
        _keep_a_worker_up(s, workers, lambda: api.get(f"/api/v1/runs/{run_id}").json()["status"]  # noqa: B023
                          in ("succeeded", "failed"))
        run = api.get(f"/api/v1/runs/{run_id}").json()
        assert run["status"] == "succeeded"
        [call] = run["toolCalls"]
        assert call["status"] == "FAILED" and "died 2 times" in call["result"]
        assert [line.split()[-1] for line in s.executions()] == ["crash", "crash"]


def test_an_llm_step_that_keeps_losing_its_worker_fails_the_run_clearly(make_stack: Callable[..., Stack],
                                                                       fake_llm: FakeLLM) -> None:
    s = make_stack(RUNTIME__MAX_RECOVERIES="2")
    fake_llm.handler = lambda body: Reply(text="never seen", delay=5)  # its worker dies long before
    workers = [s.worker()]
    killed: list[int] = []  # LLM calls seen when a worker was killed
    s.beat()
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        run_id = api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "hello"}).json()["runId"]

        def ended() -> bool:
            calls = len(fake_llm.requests)
            if calls > len(killed):  # a worker is in the step's LLM call: take it down
                killed.append(calls)
                workers[-1].kill(signal.SIGKILL)
            return api.get(f"/api/v1/runs/{run_id}").json()["status"] in ("succeeded", "failed")  # noqa: B023

        _keep_a_worker_up(s, workers, ended)
        run = api.get(f"/api/v1/runs/{run_id}").json()
        assert run["status"] == "failed" and "worker died 2 times" in run["error"]
        assert len(killed) == 2  # the second loss of the same step ended it
        messages = api.get(f"/api/v1/conversations/{cid}/messages").json()
        assert [m["role"] for m in messages] == ["USER"]  # the apology is sent, not stored as the agent's answer
    wait_until(lambda: fake_llm.in_flight == 0, message="the killed workers' LLM calls to return")  # shared fake


def test_a_cancelled_runs_waiting_tool_calls_end_with_it_and_never_run(make_stack: Callable[..., Stack],
                                                                       fake_llm: FakeLLM) -> None:
    s = make_stack()
    s.worker(queues="agent,outbound")  # nobody takes the tool call yet
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        run_id = api.post(f"/api/v1/conversations/{cid}/messages",
                          json={"message": 'call:record {"tag": "never"}'}).json()["runId"]
        wait_until(partial(_tool_statuses_are, api, run_id, ["PENDING"]), timeout=30,
                   message="the tool call to wait for a worker")
        assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
        [call] = api.get(f"/api/v1/runs/{run_id}").json()["toolCalls"]
        assert (call["status"], call["errorCode"]) == ("FAILED", "FAILED")
        assert "cancelled before this tool ran" in call["result"]
        tools = s.worker(queues="tools")  # its task arrives late and finds nothing to do
        wait_until(partial(_task_ended, tools, T_TOOL_EXECUTE), timeout=30, message="the late tool task to end")
        assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "after"}).json()[
            "assistantMessage"] == "echo: after"
    assert "never" not in " ".join(s.executions())
    assert fake_llm.calls() == 2


def test_a_turn_stopped_during_its_tools_leaves_a_history_the_model_accepts(stack: Stack, api: Any,
                                                                          fake_llm: FakeLLM) -> None:
    """Every tool call in the transcript keeps its answer (the fake refuses a prompt otherwise,
    as OpenAI and Anthropic do), so the conversation goes on after /stop."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    api.post(f"/api/v1/conversations/{cid}/messages",
             json={"message": 'call:record {"tag": "slow", "seconds": 2}\ncall:time {}'})
    wait_until(lambda: _a_tool_running(stack), timeout=30, message="the tool to start")
    assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/stop"}).json()[
        "assistantMessage"] == "Stopped 1 running task(s)."
    assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "next"}).json()[
        "assistantMessage"] == "echo: next"
    tools = {m["toolName"]: m["content"] for m in api.get(f"/api/v1/conversations/{cid}/messages").json()
             if m["role"] == "TOOL"}
    assert set(tools) == {"record", "time"}
    assert "cancelled while this tool ran" in tools["record"]


def test_the_summarize_strategy_summarises_what_the_token_guard_cut(make_stack: Callable[..., Stack],
                                                                   fake_llm: FakeLLM) -> None:
    """Long messages overflow the context window well inside the message window (20): what the
    guard left out is summarised, and the next prompt carries that summary."""
    s = make_stack(MEMORY__CONTEXT_STRATEGY="summarize", LLM__CONTEXT_WINDOW="6000", LLM__MAX_TOKENS="500")
    s.worker()
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        for i in range(4):
            api.post(f"/api/v1/conversations/{cid}/chat", json={"message": f"fact {i} " + "words " * 1500})

        def summary() -> Message | None:
            with Session(get_engine(s.settings.database_url)) as db:
                return db.exec(select(Message).where(Message.type == MessageType.SUMMARY)).first()

        assert wait_until(summary, timeout=30, message="a SUMMARY message").content.startswith("SUMMARY:")  # type: ignore[union-attr]

        def covered_role(cid: str = cid) -> Role | None:  # a question is summarised with its answer
            with Session(get_engine(s.settings.database_url)) as db:
                found = summary()
                seq = found.meta.get("covers_until_seq") if found else None
                return db.exec(select(Message.role).where(Message.conversation_id == cid, Message.seq == seq)).first()

        wait_until(lambda: covered_role() == Role.ASSISTANT, timeout=30, message="a summary up to an answer")
        api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "what do you remember?"})
        # the turn's request: a compaction the turns enqueued may call the model after it
        turn = [r for r in fake_llm.requests
                if any(m["role"] == "user" and m["content"] == "what do you remember?" for m in r["messages"])]
        system = [m["content"] for m in turn[-1]["messages"] if m["role"] == "system"]
        assert any("Summary of the earlier conversation" in c for c in system)


def test_a_cancel_reads_the_run_as_it_locks_it(stack: Stack) -> None:
    """The caller had the run in its session from before a step moved it into its tools phase: the
    cancel still answers the step's calls (it must not decide on the stale copy)."""
    with Session(get_engine(stack.settings.database_url), expire_on_commit=False) as s:
        conv = conversations.get_or_create(s, session_key="t:stale")
        run = Run(conversation_id=conv.id, status="running")
        s.add(run)
        s.commit()
        assert s.get(Run, run.id) is not None  # the caller's copy: phase llm, step 0
        with Session(get_engine(stack.settings.database_url)) as other:  # a step moves on meanwhile
            moved = other.get_one(Run, run.id)
            moved.phase, moved.step_seq = Phase.TOOLS, 1
            other.add(ToolCall(run_id=run.id, step_seq=1, position=0, call_id="c1", name="time", arguments={}))
            other.add(moved)
            other.commit()
        cancelled: list[Run] = []
        cancel(Runtime.build(stack.settings), s, run.id, "test", cancelled)
        s.commit()
        call = s.exec(select(ToolCall).where(ToolCall.run_id == run.id)).one()
        s.refresh(call)
        assert (call.status, len(cancelled)) == ("FAILED", 1)
        assert s.exec(select(Message).where(Message.run_id == run.id, Message.role == Role.TOOL)).one()


def test_compaction_stops_at_the_running_turn(stack: Stack, fake_llm: FakeLLM) -> None:
    """The running turn's messages are in its prompt whatever a summary covers: summarising them
    (each step of a long turn, with `summarize`) would cost a call and shrink nothing."""
    rt = Runtime.build(stack.settings)
    with Session(get_engine(stack.settings.database_url), expire_on_commit=False) as s:
        conv = conversations.get_or_create(s, session_key="t:compact")
        done, running = Run(conversation_id=conv.id, status="succeeded"), Run(conversation_id=conv.id)
        conv.active_run_id = running.id
        s.add_all([done, running, conv])
        s.add_all([Message(conversation_id=conv.id, run_id=done.id, role=Role.USER, content="old question"),
                   Message(conversation_id=conv.id, run_id=done.id, role=Role.ASSISTANT, content="old answer"),
                   Message(conversation_id=conv.id, run_id=running.id, role=Role.USER, content="the request")])
        s.commit()

        def tool_round(i: int) -> None:
            call = {"id": f"c{i}", "type": "function", "function": {"name": "time", "arguments": "{}"}}
            s.add(Message(conversation_id=conv.id, run_id=running.id, role=Role.ASSISTANT, tool_calls=[call]))
            s.add(Message(conversation_id=conv.id, run_id=running.id, role=Role.TOOL, content=f"r{i}",
                          tool_call_id=f"c{i}", tool_name="time"))
            s.commit()

        tool_round(1)
        assert memory.compact(rt, conv.id, keep=2)
        asked = fake_llm.requests[-1]["messages"][0]["content"]
        assert "old question" in asked and "the request" not in asked
        calls = fake_llm.calls()
        tool_round(2)
        assert not memory.compact(rt, conv.id, keep=2) and fake_llm.calls() == calls
