"""`/api/v1/subagents`: list (by conversation and status), show, cancel."""

from __future__ import annotations

import json
from collections.abc import Callable

from tests.fakes.llm import FakeLLM
from tests.support.processes import wait_until
from tests.support.scheduling import call, client, new_conversation, reports, scheduling_stack
from tests.support.stack import Stack


def test_list_show_and_cancel_subagents(make_stack: Callable[..., Stack], fake_llm: FakeLLM) -> None:
    stack = scheduling_stack(make_stack)
    with client(stack) as api:
        cid, other = new_conversation(api), new_conversation(api)
        spawn = call("spawn", task="sleep:10", label="slow").replace("sleep:", "sleep\\u003a")
        body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": spawn}).json()
        sid = json.loads(body["toolCalls"][0]["result"])["subagent_id"]
        wait_until(lambda: api.get(f"/api/v1/subagents/{sid}").json()["status"] == "running",
                   message="the subagent to start")
        [listed] = api.get("/api/v1/subagents", params={"conversationId": cid, "status": "running"}).json()
        assert (listed["subagentId"], listed["label"], listed["task"]) == (sid, "slow", "sleep:10")
        assert listed["parentConversationId"] == cid and listed["parentRunId"] == body["runId"]
        assert api.get("/api/v1/subagents", params={"conversationId": other}).json() == []
        assert api.get("/api/v1/subagents", params={"status": "succeeded"}).json() == []
        detail = api.get(f"/api/v1/subagents/{sid}").json()
        assert detail["kind"] == "subagent" and set(detail) >= {"steps", "usage", "result", "toolCalls"}

        out = api.post(f"/api/v1/subagents/{sid}/cancel").json()
        assert out == {"subagentId": sid, "status": "cancelled", "cancelled": True}
        assert api.post(f"/api/v1/subagents/{sid}/cancel").json()["cancelled"] is False
        assert [s["subagentId"] for s in api.get("/api/v1/subagents", params={"status": "cancelled"}).json()] == [sid]
        assert api.get("/api/v1/subagents/nope").status_code == 404
        assert api.get(f"/api/v1/subagents/{body['runId']}").status_code == 404  # a turn, not a subagent
        assert api.get("/api/v1/subagents", params={"status": "bogus"}).status_code == 422
        assert api.get("/api/v1/subagents", params={"conversation_id": cid}).status_code == 422
    wait_until(lambda: fake_llm.in_flight == 0, message="the cancelled subagent's LLM call to return")
    # the chat was told "I'll report back": it hears that its subagent was cancelled, once
    [report] = wait_until(lambda: reports(stack, cid), message="the report of the cancel")
    assert f"({sid}) was cancelled through the API before it finished" in report.content


def test_cancelling_a_subagents_run_tells_its_chat(make_stack: Callable[..., Stack], fake_llm: FakeLLM) -> None:
    """POST /api/v1/runs/{id}/cancel with a subagent's run id cancels it on its own, as
    /api/v1/subagents/{id}/cancel does: the chat told "I'll report back" hears it was cancelled.
    (It used to hear nothing: the runs route gave another reason, which announce() took for a /stop.)"""
    stack = scheduling_stack(make_stack)
    with client(stack) as api:
        cid = new_conversation(api)
        spawn = call("spawn", task="sleep:10", label="slow").replace("sleep:", "sleep\\u003a")
        body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": spawn}).json()
        sid = json.loads(body["toolCalls"][0]["result"])["subagent_id"]
        wait_until(lambda: api.get(f"/api/v1/subagents/{sid}").json()["status"] == "running",
                   message="the subagent to start")
        out = api.post(f"/api/v1/runs/{sid}/cancel").json()
        assert out == {"runId": sid, "cancelled": [sid]}
    wait_until(lambda: fake_llm.in_flight == 0, message="the cancelled subagent's LLM call to return")
    [report] = wait_until(lambda: reports(stack, cid), message="the report of the cancel")
    assert f"({sid}) was cancelled through the API before it finished" in report.content
