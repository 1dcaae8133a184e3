"""Listing, showing and renaming conversations: newest activity first, found by title, with the
usage of their model calls summed; chat platforms' conversations listed beside API ones, and the
sessions of cron jobs, subagents and the heartbeat only when asked for."""

from __future__ import annotations

from typing import Any

from shared.agent import conversations
from shared.constants import INTERNAL
from shared.db import session_scope
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
    assert api.patch(f"/api/v1/conversations/{cid}", json={"title": "x" * 201}).status_code == 422
    refused = api.get("/api/v1/conversations", params={"chanel": "telegram"})  # a misspelt filter lists nothing
    assert refused.status_code == 422 and "chanel" in refused.text
    assert api.get("/api/v1/conversations", params={"limit": 0}).status_code == 422
