"""Listing, showing and renaming conversations: newest activity first, found by title, with the
usage of their model calls summed; chat platforms' conversations listed beside API ones, and the
sessions of cron jobs, subagents and the heartbeat only when asked for."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from sqlmodel import col, func, select

from shared.agent import conversations
from shared.agent.events import DELETED, DELETED_LINGER, stream_key
from shared.agent.runtime import Runtime
from shared.constants import INTERNAL
from shared.db import session_scope
from shared.models import Conversation, Message, Outbox, Role, Run, RunStep, ToolCall
from tests.support.locks import cancelled_with_a_call_running, race_with_late_result
from tests.support.processes import wait_until
from tests.support.stack import Stack


def _new(api: Any, title: str | None = None) -> str:
    r = api.post("/api/v1/conversations", json={"title": title} if title else None)
    assert r.status_code == 200, r.text
    return str(r.json()["conversationId"])


def test_conversations_are_listed_by_latest_activity_and_found_by_title(stack: Stack, api: Any) -> None:
    trip = _new(api, "Trip to Kyoto")
    budget = _new(api, "100% budget_review")
    untitled = _new(api)
    with session_scope(stack.settings.database_url) as s:
        conversations.get_or_create(s, session_key="telegram:42", channel="telegram", chat_id="42")
        cron_session = conversations.get_or_create(s, session_key="cron:1", channel=INTERNAL, chat_id="1").id
    api.post(f"/api/v1/conversations/{trip}/chat", json={"message": "book the train"})  # the latest activity

    listed = api.get("/api/v1/conversations").json()
    assert [c["conversationId"] for c in listed][:1] == [trip]
    assert {c["conversationId"] for c in listed} >= {trip, budget, untitled}
    assert cron_session not in {c["conversationId"] for c in listed}  # nobody chats there: asked for by name
    assert [c["conversationId"] for c in api.get("/api/v1/conversations", params={"channel": INTERNAL}).json()] \
        == [cron_session]
    assert [c["chatId"] for c in api.get("/api/v1/conversations", params={"channel": "telegram"}).json()] == ["42"]
    assert [c["title"] for c in api.get("/api/v1/conversations", params={"q": "kyoto"}).json()] == ["Trip to Kyoto"]
    # % and _ are letters in a search, not wildcards
    assert [c["conversationId"] for c in api.get("/api/v1/conversations", params={"q": "0% b"}).json()] == [budget]
    assert api.get("/api/v1/conversations", params={"q": "1_0"}).json() == []
    page = api.get("/api/v1/conversations", params={"limit": 2, "offset": 1}).json()
    assert [c["conversationId"] for c in page] == [c["conversationId"] for c in listed[1:3]]


def test_a_conversation_shows_its_usage_and_can_be_renamed(stack: Stack, api: Any) -> None:
    cid = _new(api, "draft")
    api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "call:time {}"})
    shown = api.get(f"/api/v1/conversations/{cid}").json()
    assert shown["title"] == "draft" and shown["channel"] == "api" and shown["activeRunId"] is None
    assert shown["chatId"] == cid  # what a cron job or the message tool names it by
    assert shown["usage"]["promptTokens"] > 0 and shown["usage"]["completionTokens"] > 0  # two model calls

    renamed = api.patch(f"/api/v1/conversations/{cid}", json={"title": "Weekly plan"})
    assert renamed.status_code == 200 and renamed.json()["title"] == "Weekly plan"
    assert api.get(f"/api/v1/conversations/{cid}").json()["title"] == "Weekly plan"
    assert api.patch(f"/api/v1/conversations/{cid}", json={"title": None}).json()["title"] is None
    assert api.get("/api/v1/conversations", params={"q": "weekly"}).json() == []


def test_bad_requests_are_refused_with_what_is_wrong(api: Any) -> None:
    cid = _new(api)
    assert api.get("/api/v1/conversations/nope").status_code == 404
    assert api.patch("/api/v1/conversations/nope", json={"title": "x"}).status_code == 404
    assert api.patch(f"/api/v1/conversations/{cid}", json={}).status_code == 422  # say what the title becomes
    for too_long in (api.patch(f"/api/v1/conversations/{cid}", json={"title": "x" * 201}),
                     api.post("/api/v1/conversations", json={"title": "x" * 201}),
                     api.post(f"/api/v1/conversations/{cid}/regenerate", json={"message": "x" * 100_001})):
        assert too_long.status_code == 422, too_long.text  # counted in characters, as every other string
        assert too_long.json()["detail"][0]["msg"].endswith(" characters"), too_long.text
    assert api.patch(f"/api/v1/conversations/{cid}", json={"title": ""}).status_code == 422  # null removes it
    refused = api.get("/api/v1/conversations", params={"chanel": "telegram"})  # a misspelt filter lists nothing
    assert refused.status_code == 422 and "chanel" in refused.text
    assert api.get("/api/v1/conversations", params={"limit": 0}).status_code == 422
    for path, params in ((f"/api/v1/conversations/{cid}/messages", "lmit=1"),
                         (f"/api/v1/conversations/{cid}/messages", "limit=1&limit=2"),
                         ("/api/v1/outbox", "statuss=failed")):
        refused = api.get(f"{path}?{params}")
        assert refused.status_code == 422 and "unknown or repeated query parameter" in refused.text, params
    misspelt = (("/api/v1/conversations", {"titel": "x"}), (f"/api/v1/conversations/{cid}", {"title": "x", "x": 1}),
                (f"/api/v1/conversations/{cid}/messages", {"message": "hi", "modle": "openai/gpt-4.1"}))
    for path, body in misspelt:
        sent = api.patch(path, json=body) if path.endswith(cid) else api.post(path, json=body)
        assert sent.status_code == 422 and "Extra inputs are not permitted" in sent.text, (path, sent.text)
        assert sent.json()["detail"][0]["loc"][-1] == next(k for k in body if k not in ("title", "message"))
    assert api.get(f"/api/v1/conversations/{cid}/messages").json() == []  # nothing was taken in


def _rows(stack: Stack, cids: list[str]) -> dict[str, int]:
    """How many rows each table holds for these conversations."""
    with session_scope(stack.settings.database_url) as s:
        runs = select(Run.id).where(col(Run.conversation_id).in_(cids))
        return {name: s.exec(select(func.count()).select_from(model).where(which)).one() for name, model, which in (
            ("conversations", Conversation, col(Conversation.id).in_(cids)),
            ("messages", Message, col(Message.conversation_id).in_(cids)),
            ("runs", Run, col(Run.conversation_id).in_(cids)),
            ("run_steps", RunStep, col(RunStep.run_id).in_(runs)),
            ("tool_calls", ToolCall, col(ToolCall.run_id).in_(runs)),
            ("outbox", Outbox, col(Outbox.run_id).in_(runs)),
        )}


def test_a_deleted_conversation_leaves_nothing_behind(stack: Stack, api: Any) -> None:
    """Its messages, runs, steps, tool calls, sends not made yet, its subagents' sessions, the
    reminders that post to it and its event stream go; another conversation is untouched."""
    cid, other = _new(api, "to forget"), _new(api, "to keep")
    for c in (cid, other):
        assert api.post(f"/api/v1/conversations/{c}/chat", json={"message": "call:time {}"}).status_code == 200
    with session_scope(stack.settings.database_url) as s:
        child = conversations.get_or_create(s, session_key=f"subagent:{cid}", channel=INTERNAL, chat_id="c",
                                            meta={"parent_conversation_id": cid}).id
        s.add(Message(conversation_id=child, role=Role.USER, content="the subagent's task"))
        [run_id] = s.exec(select(Run.id).where(Run.conversation_id == cid)).all()
        s.add(Outbox(key=f"{run_id}:0", channel="telegram", chat_id="42", content="undelivered", run_id=run_id))
    reminder = api.post("/api/v1/cron", json={"message": "water the plants", "everySeconds": 3600,
                                              "channel": "api", "chatId": cid}).json()["id"]
    by_key = api.post("/api/v1/cron", json={"message": "stretch", "everySeconds": 3600,  # named by its session key
                                            "channel": "api", "chatId": f"api:{cid}"}).json()["id"]
    elsewhere = api.post("/api/v1/cron", json={"message": "stand-up", "everySeconds": 3600,
                                               "channel": "api", "chatId": other}).json()["id"]
    before = _rows(stack, [cid, child])
    assert all(before.values()), before
    kept = _rows(stack, [other])
    streams = redis.Redis.from_url(stack.settings.redis_url)
    assert streams.exists(stream_key(cid))

    assert api.delete(f"/api/v1/conversations/{cid}").status_code == 204
    assert set(_rows(stack, [cid, child]).values()) == {0}
    assert _rows(stack, [other]) == kept
    last = streams.xrevrange(stream_key(cid), count=1)[0][1]  # open readers see it and end
    assert last[b"event"] == DELETED.encode() and 0 < streams.ttl(stream_key(cid)) <= DELETED_LINGER
    assert api.get(f"/api/v1/conversations/{cid}").status_code == 404
    assert api.get(f"/api/v1/conversations/{cid}/messages").status_code == 404
    assert api.delete(f"/api/v1/conversations/{cid}").status_code == 404
    assert api.get(f"/api/v1/conversations/{other}/messages").json()[-1]["content"].startswith("done: ")
    assert api.get(f"/api/v1/cron/{reminder}").status_code == 404  # it would run, and post nowhere
    assert api.get(f"/api/v1/cron/{by_key}").status_code == 404
    assert api.get(f"/api/v1/cron/{elsewhere}").status_code == 200
    assert api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "hi"}).status_code == 404


def test_a_conversation_with_a_turn_going_is_not_deleted(stack: Stack, api: Any) -> None:
    cid = _new(api)
    run_id = api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "sleep:3"}).json()["runId"]
    refused = api.delete(f"/api/v1/conversations/{cid}")
    assert refused.status_code == 409 and refused.json()["runIds"] == [run_id] and "/stop" in refused.json()["detail"]
    assert _rows(stack, [cid])["messages"] == 1
    wait_until(lambda: api.get(f"/api/v1/runs/{run_id}").json()["status"] == "succeeded", timeout=30,
               message="the turn to end")
    assert api.delete(f"/api/v1/conversations/{cid}").status_code == 204


def test_a_conversation_is_deleted_while_a_stopped_tool_writes_its_result(stack: Stack, api: Any) -> None:
    """/stop leaves a running tool to finish, and the DELETE that follows met its result's write:
    each waited for a row the other held, and Postgres failed the DELETE (a 500) as a deadlock."""
    rt = Runtime.build(stack.settings)
    late = cancelled_with_a_call_running(rt, session_key="api:late-result")
    statuses: list[int] = []

    def delete() -> None:
        statuses.append(api.delete(f"/api/v1/conversations/{late.conversation_id}").status_code)

    assert race_with_late_result(rt, late, delete) == {}
    assert statuses == [204] and set(_rows(stack, [late.conversation_id]).values()) == {0}


def test_a_body_sent_as_a_form_is_told_to_be_json(api: Any) -> None:
    """`curl -d '{"message": "hi"}'` sends a form: FastAPI's 422 spoke of "a valid dictionary or object
    to extract fields from" (helper's walkthrough)."""
    cid = _new(api)
    for headers in ({"Content-Type": "application/x-www-form-urlencoded"}, {"Content-Type": "text/plain"}):
        refused = api.post(f"/api/v1/conversations/{cid}/messages", content=b'{"message": "hi"}', headers=headers)
        assert refused.status_code == 422
        [error] = refused.json()["detail"]
        assert "Content-Type: application/json" in error["msg"] and headers["Content-Type"] in error["msg"]
    wrong = api.post(f"/api/v1/conversations/{cid}/messages", json={"text": "hi"})  # JSON, a wrong field: as before
    assert wrong.status_code == 422 and "Content-Type" not in wrong.text


@pytest.mark.parametrize(("body", "said"), [
    (b"[" * 100_000, "nests arrays or objects too deep"),
    (b'{"message": "x", "model": ' + b"1" * 5000 + b"}", "too many digits"),
    (b'{"message": "caf\xe9"}', "not UTF-8"),
])
def test_a_body_json_cannot_read_is_told_what_is_wrong(api: Any, body: bytes, said: str) -> None:
    """FastAPI's 400 said only "There was an error parsing the body"."""
    cid = _new(api)
    refused = api.post(f"/api/v1/conversations/{cid}/messages", content=body,
                       headers={"Content-Type": "application/json"})
    assert refused.status_code == 400 and said in refused.json()["detail"]
