"""The SSE stream, /new, and the in-process `nanofleet agent`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from sqlalchemy import text
from sqlmodel import Session, select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from shared.agent.events import stream_key
from shared.db import get_engine
from shared.models import Message, MessageType
from tests.fakes.llm import FakeLLM
from tests.fakes.server import ThreadServer
from tests.support.processes import ROOT, wait_until
from tests.support.stack import Stack


def test_events_stream_a_tool_using_turn(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    seen: list[tuple[str, dict[str, Any]]] = []
    opened = threading.Event()

    def listen() -> None:
        with api.stream("GET", f"/api/v1/conversations/{cid}/events") as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            opened.set()
            event = ""
            for line in r.iter_lines():
                if line.startswith("event:"):
                    event = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and event:
                    seen.append((event, json.loads(line.split(":", 1)[1])))
                    if event in ("run.finished", "run.failed"):
                        return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert opened.wait(10)
    # the stream starts at the newest event when the listener connected: everything after is seen
    wait_until(lambda: api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "call:time {}"}), timeout=30)
    listener.join(30)
    kinds = [e for e, _ in seen]
    assert kinds[0] == "run.started" and kinds[-1] == "run.finished"
    assert {"step.started", "tool.started", "tool.finished", "text.delta"} <= set(kinds)
    finished = next(d for e, d in seen if e == "tool.finished")
    assert finished["tool"] == "time" and finished["status"] == "SUCCESS" and finished["elapsed_ms"] >= 0
    text = "".join(d["text"] for e, d in seen if e == "text.delta")
    assert text.startswith("done: ")
    with fake_llm.lock:
        assert all(b.get("stream") for b in fake_llm.requests if "call:time" in json.dumps(b))


def test_last_event_id_zero_replays_a_finished_run(stack: Stack, api: Any) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "hi"}).json()["assistantMessage"]
    events: list[str] = []
    with api.stream("GET", f"/api/v1/conversations/{cid}/events", headers={"Last-Event-ID": "0"}) as r:
        for line in r.iter_lines():
            if line.startswith("event:"):
                events.append(line.split(":", 1)[1].strip())
                if events[-1] == "run.finished":
                    break
    assert events[0] == "run.started" and events[-1] == "run.finished"


def test_unwatched_conversations_are_not_streamed(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    """Nobody reads the events: the model is called without streaming and no deltas are written,
    while the other events (what `/chat` and the channels wait for) still are."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    reply = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "call:time {}"}).json()
    assert reply["assistantMessage"].startswith("done: ")
    with fake_llm.lock:
        bodies = [b for b in fake_llm.requests if "call:time" in json.dumps(b)]
    assert len(bodies) == 2 and not any(b.get("stream") for b in bodies)
    client = redis.Redis.from_url(stack.settings.redis_url, decode_responses=True)
    kinds = [fields["event"] for _, fields in client.xrange(stream_key(cid))]
    assert "run.finished" in kinds and "tool.finished" in kinds and "text.delta" not in kinds


def test_new_summarises_and_starts_fresh(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "my name is Ada"})
    assert "new session" in api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/new"}).json()[
        "assistantMessage"]

    def summary() -> Message | None:
        with Session(get_engine(stack.settings.database_url)) as s:
            found = s.exec(select(Message).where(Message.type == MessageType.SUMMARY)).first()
            return found if found is not None and found.content else None

    wait_until(summary, timeout=30, message="the /new summary")
    api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "who am I?"})
    sent = _turn_request(fake_llm, "who am I?")
    assert not any(m["content"] == "my name is Ada" for m in sent)  # a fresh session...
    assert any("Summary of the earlier conversation" in str(m["content"]) for m in sent)  # ...that remembers


def test_new_waits_for_a_compaction_already_running(stack: Stack, api: Any) -> None:
    """/new arriving while an automatic compaction holds the conversation's lease still resets it."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "my name is Ada"})
    with _compacting(stack, cid):
        api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/new"})
        wait_until(lambda: _retried(stack), timeout=30, message="the /new compaction to find the lease taken")

    def reset() -> Message | None:
        with Session(get_engine(stack.settings.database_url)) as s:
            found = s.exec(select(Message).where(Message.type == MessageType.SUMMARY)).first()
            return found if found is not None and found.meta.get("reset") else None

    wait_until(reset, timeout=30, message="the /new summary")


def test_new_holds_from_the_next_message_and_its_summary_covers_only_what_came_before(
        stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    """The next message after /new starts fresh however long the summary takes, and the summary
    does not swallow the new session's first exchange. (The cut used to be made by the compaction
    task: until it ran, the old history was still sent, and what it covered was whatever the
    conversation held by then.)"""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    chat = f"/api/v1/conversations/{cid}/chat"
    api.post(chat, json={"message": "my name is Ada"})
    with _compacting(stack, cid):  # the summary cannot be written yet
        api.post(chat, json={"message": "/new"})
        assert api.post(chat, json={"message": "who am I?"}).json()["assistantMessage"] == "echo: who am I?"
    assert "my name is Ada" not in json.dumps(_turn_request(fake_llm, "who am I?"))

    def written() -> Message | None:
        with Session(get_engine(stack.settings.database_url)) as s:
            found = s.exec(select(Message).where(Message.type == MessageType.SUMMARY)).first()
            return found if found is not None and found.content and "summary_due" not in found.meta else None

    summary = wait_until(written, timeout=30, message="the /new summary")
    assert "my name is Ada" in summary.content and "who am I" not in summary.content
    api.post(chat, json={"message": "and now?"})
    sent = json.dumps(_turn_request(fake_llm, "and now?"))
    assert "who am I?" in sent and "Summary of the earlier conversation" in sent and "my name is Ada" in sent


def _turn_request(fake_llm: FakeLLM, text: str) -> list[dict[str, Any]]:
    """The messages of the turn that answered `text` (not a compaction that quoted it)."""
    with fake_llm.lock:
        bodies = [b for b in fake_llm.requests if any(m.get("content") == text for m in b["messages"])]
    assert bodies, f"no turn answered {text!r}"
    messages: list[dict[str, Any]] = bodies[0]["messages"]
    return messages


@contextmanager
def _compacting(stack: Stack, cid: str) -> Iterator[None]:
    """Another compaction of the conversation holds its lease meanwhile."""
    with get_engine(stack.settings.database_url).begin() as conn:
        conn.execute(text("update conversations set compacting_until = now() + interval '10 minutes' where id = :c"),
                     {"c": cid})
    try:
        yield
    finally:
        with get_engine(stack.settings.database_url).begin() as conn:
            conn.execute(text("update conversations set compacting_until = null where id = :c"), {"c": cid})


def _retried(stack: Stack) -> bool:
    return any("compaction of this conversation is running" in p.log() for p in stack.procs)


def test_agent_command_runs_one_turn_in_process(stack: Stack) -> None:
    env = {**stack.env, "NANOFLEET_REDIS_URL": "redis://127.0.0.1:1/0"}  # no broker needed
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "agent", "-m", "call:time {}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("done: ")


def test_agent_command_masks_secrets_in_what_it_logs(stack: Stack) -> None:
    """A provider that repeats the API key in its refusal: the workers log it masked, and `nanofleet
    agent` printed it whole (it set up no logging of its own)."""
    async def refuse(request: Request) -> JSONResponse:
        said = f"Incorrect API key provided: {request.headers.get('authorization')}"
        return JSONResponse({"error": {"message": said, "type": "invalid_request_error"}}, status_code=401)

    server = ThreadServer(Starlette(routes=[Route("/v1/chat/completions", refuse, methods=["POST"])])).start()
    key = "sk-must-not-leak-0123456789abcdef"
    env = {**stack.env, "NANOFLEET_LLM__API_BASE": f"{server.url}/v1", "NANOFLEET_LLM__API_KEY": key}
    try:
        done = subprocess.run([sys.executable, "-m", "gateway.cli", "agent", "-m", "hi"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    assert done.returncode == 1 and "check the API key" in done.stdout, done.stdout + done.stderr
    assert "Incorrect API key provided: Bearer ***" in done.stderr and key not in done.stdout + done.stderr
