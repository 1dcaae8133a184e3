"""Turns end to end: gateway in-process, real worker process, fake LLM over HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text as sql

from shared.agent.service import dollars
from shared.constants import EMPTY_ANSWER
from shared.db import get_engine
from tests.fakes.llm import FakeLLM, Reply, default_handler
from tests.support.processes import wait_until
from tests.support.stack import Stack, api_client


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


def test_rejected_tool_still_gets_a_final_answer(stack: Stack, api: Any) -> None:
    cid = new_conversation(api)
    body = api.post(f"/api/v1/conversations/{cid}/chat",
                    json={"message": 'call:forbidden {"tag": "a"}\ncall:needs_shell {"seconds": 0}'}).json()
    assert [(c["toolName"], c["status"]) for c in body["toolCalls"]] == [
        ("forbidden", "REJECTED"), ("needs_shell", "REJECTED")]
    assert "not allowed" in body["toolCalls"][0]["result"] and "SHELL" in body["toolCalls"][1]["result"]
    assert body["assistantMessage"].startswith("done: ")
    assert stack.executions() == []  # a rejected call has no side effect


def test_invalid_arguments_and_timeouts_reach_the_model(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    cid = new_conversation(api)
    body = api.post(f"/api/v1/conversations/{cid}/chat",
                    json={"message": 'call:record {"tag": 7}\ncall:sleepy {"seconds": 20}'}).json()
    assert [c["status"] for c in body["toolCalls"]] == ["FAILED", "FAILED"]
    assert [c["errorCode"] for c in body["toolCalls"]] == ["INVALID_ARGS", "TIMEOUT"]
    tool_msgs = [m for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert "INVALID_ARGS" in tool_msgs[0]["content"] and "TIMEOUT" in tool_msgs[1]["content"]


def test_parallel_tool_calls_each_run_once(stack: Stack, api: Any) -> None:
    cid = new_conversation(api)
    lines = "\n".join(f'call:record {{"tag": "t{i}"}}' for i in range(5))
    body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": lines}).json()
    assert [c["status"] for c in body["toolCalls"]] == ["SUCCESS"] * 5
    tags = sorted(line.split()[-1] for line in stack.executions())
    assert tags == [f"t{i}" for i in range(5)]


def test_request_model_overrides_the_default_and_usage_is_summed(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    cid = new_conversation(api)
    body = api.post(f"/api/v1/conversations/{cid}/chat",
                    json={"message": "call:time {}", "model": "openai/other-model"}).json()
    assert {r["model"] for r in fake_llm.requests} == {"other-model"}
    run = api.get(f"/api/v1/runs/{body['runId']}").json()
    llm_steps = [st for st in run["steps"] if st["kind"] == "llm"]
    assert len(llm_steps) == 2 and all(st["promptTokens"] > 0 for st in llm_steps)
    assert run["usage"]["promptTokens"] == sum(st["promptTokens"] for st in llm_steps)


def test_a_fallback_model_answers_when_the_default_fails(make_stack: Callable[..., Stack], fake_llm: FakeLLM) -> None:
    s = make_stack(LLM__PROFILES='{"backup": {"model": "openai/backup-model"}}', LLM__FALLBACKS='["backup"]')
    s.worker()
    fake_llm.handler = lambda body: Reply(status=503) if body["model"] == "fake-model" else default_handler(body)
    for api in api_client(s.settings):
        body = api.post(f"/api/v1/conversations/{new_conversation(api)}/chat", json={"message": "call:time"}).json()
        assert body["status"] == "succeeded" and body["assistantMessage"].startswith("done: ")
        run = api.get(f"/api/v1/runs/{body['runId']}").json()
        assert [st["model"] for st in run["steps"] if st["kind"] == "llm"] == ["openai/backup-model"] * 2
        assert {r["model"] for r in fake_llm.requests} == {"fake-model", "backup-model"}


def test_llm_failure_after_retries_is_a_clear_reply_not_stored(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    from tests.fakes.llm import Reply

    fake_llm.handler = lambda body: Reply(status=503)
    cid = new_conversation(api)
    body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "hello"}).json()
    assert body["status"] == "failed" and "try again" in body["assistantMessage"]
    assert fake_llm.calls() == 3  # the first call and two retries
    roles = [m["role"] for m in api.get(f"/api/v1/conversations/{cid}/messages").json()]
    assert roles == ["USER"]


def test_rate_limit_is_retried_honouring_retry_after(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    from tests.fakes.llm import Reply, default_handler

    answers = iter([Reply(status=429, headers={"retry-after": "1.5"})])
    arrivals: list[float] = []

    def handler(body: dict[str, Any]) -> Reply:
        arrivals.append(time.monotonic())
        return next(answers, None) or default_handler(body)

    fake_llm.handler = handler
    cid = new_conversation(api)
    body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "hi"}).json()
    assert body["assistantMessage"] == "echo: hi" and fake_llm.calls() == 2
    # the stack's own backoff is at most 0.1 s at the first retry: only the header explains the wait
    assert arrivals[1] - arrivals[0] >= 1.4


def test_a_refused_request_is_a_clear_reply_without_retries(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    from tests.fakes.llm import Reply

    fake_llm.handler = lambda body: Reply(status=401)
    cid = new_conversation(api)
    body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "hello"}).json()
    assert body["status"] == "failed" and "AuthenticationError" in body["assistantMessage"]
    assert fake_llm.calls() == 1
    roles = [m["role"] for m in api.get(f"/api/v1/conversations/{cid}/messages").json()]
    assert roles == ["USER"]


def test_post_returns_at_once_and_the_run_can_be_read(stack: Stack, api: Any) -> None:
    cid = new_conversation(api)
    r = api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "sleep:0.5 hi"})
    assert r.status_code == 202 and r.json()["runId"]
    run_id = r.json()["runId"]
    wait_until(lambda: api.get(f"/api/v1/runs/{run_id}").json()["status"] == "succeeded", timeout=30,
               message="the run to finish")
    assert api.get(f"/api/v1/runs/{run_id}").json()["result"] == "echo: sleep:0.5 hi"


def test_unknown_conversation_and_bad_body(stack: Stack, api: Any) -> None:
    assert api.post("/api/v1/conversations/nope/chat", json={"message": "x"}).status_code == 404
    assert api.post("/api/v1/conversations/nope/messages", json={"message": "x"}).status_code == 404
    assert api.post("/api/v1/conversations/nope/chat", json={"message": "/help"}).status_code == 404
    assert api.get("/api/v1/conversations/nope/messages").status_code == 404
    cid = new_conversation(api)
    assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": ""}).status_code == 422
    assert api.post(f"/api/v1/conversations/{cid}/chat", json={}).status_code == 422
    assert api.get("/api/v1/runs/nope").status_code == 404


def test_help_command_answers_without_the_llm(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    cid = new_conversation(api)
    body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/help"}).json()
    assert "/stop" in body["assistantMessage"] and fake_llm.calls() == 0


def test_an_empty_answer_still_gets_a_reply(stack: Stack, api: Any, fake_llm: FakeLLM) -> None:
    fake_llm.handler = lambda body: Reply(text="")
    cid = new_conversation(api)
    body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "hello"}).json()
    assert body["status"] == "succeeded" and body["assistantMessage"] == EMPTY_ANSWER
    messages = api.get(f"/api/v1/conversations/{cid}/messages").json()
    assert [(m["role"], m["content"]) for m in messages] == [("USER", "hello"), ("ASSISTANT", EMPTY_ANSWER)]


def test_a_chat_chooses_its_model_among_the_profiles(make_stack: Callable[..., Stack], fake_llm: FakeLLM) -> None:
    s = make_stack(LLM__PROFILES='{"cheap": {"model": "openai/cheap-model"}}')
    s.worker()

    def say(api: Any, cid: str, text: str, **extra: str) -> str:
        return str(api.post(f"/api/v1/conversations/{cid}/chat", json={"message": text, **extra}).json()[
            "assistantMessage"])

    for api in api_client(s.settings):
        cid, other = new_conversation(api), new_conversation(api)
        assert say(api, cid, "/model") == ("This chat uses the default model (openai/fake-model); "
                                           "choices: default, cheap.")
        assert say(api, cid, "/model dear") == "There is no model 'dear' here; choices: default, cheap."
        assert say(api, cid, "/model cheap").startswith("This chat now uses cheap (openai/cheap-model)")
        for text in ("one", "two"):
            assert say(api, cid, text) == f"echo: {text}"
        assert say(api, other, "three") == "echo: three"  # another chat keeps the default
        assert say(api, cid, "four", model="openai/asked-model") == "echo: four"  # a message's own model wins
        assert say(api, cid, "/model default").startswith("This chat uses the default model")
        assert say(api, cid, "five") == "echo: five"
        assert [r["model"] for r in fake_llm.requests] == [
            "cheap-model", "cheap-model", "fake-model", "asked-model", "fake-model"]
        say(api, cid, "/model cheap")
        with get_engine(s.settings.database_url).begin() as conn:  # as if the operator removed the profile since
            conn.execute(sql("""update conversations set meta = meta || '{"model": "retired"}' where id = :c"""),
                         {"c": cid})
        assert say(api, cid, "six") == "echo: six"  # on the default model, not failing
        assert fake_llm.requests[-1]["model"] == "fake-model"
        assert "'retired', which is no longer configured" in say(api, cid, "/model")


def test_usage_in_chat_is_what_the_runs_recorded(stack: Stack, api: Any) -> None:
    cid = new_conversation(api)
    runs = [api.post(f"/api/v1/conversations/{cid}/chat", json={"message": m}).json()["runId"]
            for m in ("call:time", "hello")]
    used = [api.get(f"/api/v1/runs/{run_id}").json()["usage"] for run_id in runs]
    prompt, completion = sum(u["promptTokens"] for u in used), sum(u["completionTokens"] for u in used)
    assert prompt > 0 and completion > 0
    reply = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/usage"}).json()["assistantMessage"]
    assert reply == (f"This chat so far: {prompt:,} prompt and {completion:,} completion tokens, "
                     f"{dollars(sum(u['cost'] for u in used))}.")


@pytest.mark.parametrize(("cost", "shown"), [(0.0, "$0.00"), (1.554e-05, "$0.000016"), (0.0123, "$0.0123"),
                                             (1234.5, "$1,234.50"), (4e-8, "under $0.000001")])
def test_usage_shows_what_a_cheap_model_costs(cost: float, shown: str) -> None:
    assert dollars(cost) == shown  # four decimals showed a cheap model's chat as $0.0000


def test_a_nul_from_the_model_or_a_tool_is_dropped_without_failing_the_turn(stack: Stack, api: Any,
                                                                           fake_llm: FakeLLM) -> None:
    """Postgres holds no NUL: a model's answer, its tool call's arguments or a tool's output with one
    failed the step five times, each after a paid call. A NUL in the arguments refuses the call (run
    without it, the tool would act on another path or command than the model's)."""
    def handler(body: dict[str, Any]) -> Reply:
        if any(m.get("role") == "tool" for m in body["messages"]):
            return Reply(text="before\x00after")
        return Reply(tool_calls=[("record", {"tag": "nul\x00here"})])

    fake_llm.handler = handler
    cid = new_conversation(api)
    body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "go"}).json()
    assert body["status"] == "succeeded" and body["assistantMessage"] == "beforeafter"
    [refused] = body["toolCalls"]
    assert (refused["status"], refused["errorCode"]) == ("FAILED", "INVALID_ARGS")
    assert "NUL character" in refused["result"] and refused["arguments"]["tag"] == "nulhere"
    assert fake_llm.calls() == 2  # none again
    assert stack.executions() == []  # not run on "nulhere"
    worker = next(p for p in stack.procs if p.alive())  # refused before the registry saw it, and audited all the same
    audited = f"tool=record status=FAILED code=INVALID_ARGS duration_ms=0.0 run={body['runId']} args_sha256="
    wait_until(lambda: audited in worker.log(), message="its audit record")
