"""Turns end to end: gateway in-process, real worker process, fake LLM over HTTP."""

from __future__ import annotations

from typing import Any

from tests.fakes.llm import FakeLLM
from tests.support.stack import Stack


def new_conversation(api: Any) -> str:
    r = api.post("/api/v1/conversations")
    assert r.status_code == 200, r.text
    return str(r.json()["conversationId"])


def test_chat_with_a_tool_call(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    cid = new_conversation(api)
    r = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": 'call:time {"tz": "Europe/Paris"}'})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["conversationId"] == cid
    assert body["assistantMessage"].startswith("done: ")
    assert [c["toolName"] for c in body["toolCalls"]] == ["time"]
    assert body["toolCalls"][0]["status"] == "SUCCESS"
    assert "+01:00" in body["toolCalls"][0]["result"] or "+02:00" in body["toolCalls"][0]["result"]
    roles = [m["role"] for m in api.get(f"/api/v1/conversations/{cid}/messages").json()]
    assert roles == ["USER", "ASSISTANT", "TOOL", "ASSISTANT"]
    assert fake_llm.calls() == 2


def test_plain_chat_and_history_order(stack: Stack, api: Any) -> None:
    cid = new_conversation(api)
    for text in ("one", "two", "three"):
        r = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": text})
        assert r.json()["assistantMessage"] == f"echo: {text}"
    contents = [m["content"] for m in api.get(f"/api/v1/conversations/{cid}/messages").json()]
    assert contents == ["one", "echo: one", "two", "echo: two", "three", "echo: three"]
