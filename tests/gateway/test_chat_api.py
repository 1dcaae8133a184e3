"""/chat when the answer is slow, or the gateway shuts down meanwhile: a 504 that says which run
to follow; and a wait that does not depend on Redis to notice the end; a message
posted while the broker is down is kept and answered; following a conversation's messages with
`after`."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gateway.state import async_redis
from gateway.waiting import wait_for_run
from shared.models import TERMINAL, Run, RunStatus
from shared.queueing import Producer, make_celery
from tests.fakes.llm import FakeLLM
from tests.support.processes import wait_until
from tests.support.stack import Stack, api_client, gateway_process


def test_a_chat_that_times_out_names_the_run_to_follow(stack: Stack) -> None:
    quick = stack.settings.model_copy(update={"agent": stack.settings.agent.model_copy(update={"chat_timeout": 0.2})})
    for api in api_client(quick):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        answer = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "sleep:3"})
        assert answer.status_code == 504, answer.text
        body = answer.json()
        assert body["conversationId"] == cid and body["runId"]
        assert isinstance(body["detail"], str) and "{" not in body["detail"]
        assert f"GET /api/v1/runs/{body['runId']}" in body["detail"]
        run = wait_until(functools.partial(_finished, api, body["runId"]), timeout=30, message="the run to end")
        assert run["result"] == "echo: sleep:3"  # type: ignore[index]


def test_a_chat_waiting_when_the_gateway_stops_names_the_run_to_follow(make_stack: Callable[..., Stack]) -> None:
    """SIGTERM (a deploy) while /chat waits: the gateway answers the waiter at once with the run to
    follow, instead of holding it until it is killed at the end of its grace period."""
    s = make_stack()  # no worker: the run waits in the queue
    with gateway_process(s) as (proc, client), ThreadPoolExecutor(1) as pool:
        cid = client.post("/api/v1/conversations").json()["conversationId"]
        waiting = pool.submit(client.post, f"/api/v1/conversations/{cid}/chat", json={"message": "hi"})
        wait_until(lambda: client.get(f"/api/v1/conversations/{cid}/messages").json(), timeout=30,
                   message="the message to be stored")
        os.killpg(proc.pid, signal.SIGTERM)
        answer = waiting.result(timeout=20)  # the chat timeout is 120 s
        assert answer.status_code == 504, answer.text  # the run goes on (a 503 says nothing was sent)
        body = answer.json()
        assert body["conversationId"] == cid and body["runId"], body
        assert "shutting down" in body["detail"] and f"GET /api/v1/runs/{body['runId']}" in body["detail"]
        assert proc.popen.wait(30) in (0, -signal.SIGTERM), proc.log()


def _finished(api: Any, run_id: str) -> dict[str, Any] | None:
    run: dict[str, Any] = api.get(f"/api/v1/runs/{run_id}").json()
    return run if RunStatus(run["status"]) in TERMINAL else None


def test_waiting_for_a_run_needs_no_redis(stack: Stack, api: Any) -> None:
    """With Redis unreachable (or every connection in use) the wait confirms the end in Postgres."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    posted = api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "sleep:1"}).json()

    async def wait_cut_off() -> Run:
        nowhere = async_redis("redis://127.0.0.1:1/0", wait=0.1)
        try:
            cut_off = dataclasses.replace(api.app.state.nanofleet, aredis=nowhere)
            return await wait_for_run(cut_off, conversation_id=cid, message_id=posted["messageId"], run_id=None,
                                      since="0-0", timeout=30)
        finally:
            await nowhere.aclose()

    run = asyncio.run(wait_cut_off())
    assert run.id == posted["runId"] and run.status == RunStatus.SUCCEEDED


def test_a_message_posted_while_the_broker_is_down_is_accepted_and_answered(
        make_stack: Callable[..., Stack]) -> None:
    """The message and its run are in Postgres before the enqueue: a broker that refuses the task
    fails nothing. (It used to retry Celery's result store for 19 s and answer 500, and a client
    that then sent again had its message twice.) The sweeper enqueues the run once Redis answers."""
    s = make_stack()
    s.worker()
    s.beat()
    nowhere = s.settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    for api in api_client(s.settings):
        api.app.state.nanofleet.producer = Producer(make_celery(nowhere, name="cut-off"))
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        posted = api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "while down"})
        assert posted.status_code == 202, posted.text
        run = wait_until(functools.partial(_finished, api, posted.json()["runId"]), timeout=60,
                         message="the sweeper to start the run")
        assert run["status"] == "succeeded" and run["result"] == "echo: while down"  # type: ignore[index]


def test_new_while_the_broker_is_down_is_kept_and_summarised_later(make_stack: Callable[..., Stack]) -> None:
    """`/new` takes effect in the request's transaction and its summary is marked due there: a
    compaction task the broker refused is sent again by the sweeper. (It was a 503 before, and by a
    webhook, whose retry the ledger drops, the /new was lost.)"""
    s = make_stack()
    s.worker()
    s.beat()
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "my name is Ada"}).status_code == 200
        nowhere = s.settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
        api.app.state.nanofleet.producer = Producer(make_celery(nowhere, name="cut-off"))
        answer = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "/new"})
        assert answer.status_code == 200 and "new session" in answer.json()["assistantMessage"], answer.text
        summary = wait_until(functools.partial(_written_summary, api, cid), timeout=60,
                             message="the sweeper to send the /new summary")
        assert summary["content"].startswith("SUMMARY: ") and "my name is Ada" in summary["content"]  # type: ignore[index]


def _written_summary(api: Any, cid: str) -> dict[str, Any] | None:
    listed = api.get(f"/api/v1/conversations/{cid}/messages").json()
    return next((m for m in listed if m["type"] == "SUMMARY" and m["content"]), None)


def test_following_a_conversation_with_after_misses_nothing(stack: Stack, api: Any) -> None:
    """A message sent while a turn runs waits in the mailbox, then joins the transcript at its end:
    a client that asks for what comes after the largest seq it saw (not pending) gets every message."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    url = f"/api/v1/conversations/{cid}/messages"
    api.post(url, json={"message": 'call:record {"tag": "a", "seconds": 1.5}'})
    wait_until(functools.partial(_has_role, api, url, "ASSISTANT"), timeout=30, message="the tool call")
    api.post(url, json={"message": "meanwhile"})
    first = api.get(url).json()
    assert [m["pending"] for m in first if m["content"] == "meanwhile"] == [True]
    seen = {m["id"] for m in first if not m["pending"]}
    after = max(m["seq"] for m in first if not m["pending"] and m["type"] == "NORMAL")
    wait_until(functools.partial(_settled, api, url), timeout=30, message="both messages answered")
    later = api.get(url, params={"after": after}).json()
    everything = api.get(url).json()
    assert seen | {m["id"] for m in later} == {m["id"] for m in everything}
    [moved] = [m for m in later if m["content"] == "meanwhile"]  # listed again, taken in, with a new seq
    assert not moved["pending"] and moved["seq"] > after
    assert api.get(url, params={"after": -1}).status_code == 422


def _has_role(api: Any, url: str, role: str) -> bool:
    return any(m["role"] == role for m in api.get(url).json())


def _settled(api: Any, url: str) -> bool:
    rows = api.get(url).json()
    last = rows[-1]
    return not any(m["pending"] for m in rows) and last["role"] == "ASSISTANT" and "meanwhile" in last["content"]


def test_an_operator_can_limit_the_models_a_request_names(stack: Stack) -> None:
    llm = stack.settings.llm.model_copy(update={"allowed_models": ["openai/cheap"]})
    for api in api_client(stack.settings.model_copy(update={"llm": llm})):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        url = f"/api/v1/conversations/{cid}"
        refused = api.post(f"{url}/chat", json={"message": "hi", "model": "openai/expensive"})
        assert refused.status_code == 422 and "openai/cheap" in refused.json()["detail"]
        assert api.post(f"{url}/messages", json={"message": "hi", "model": "openai/expensive"}).status_code == 422
        assert api.get(f"{url}/messages").json() == []  # nothing stored, no LLM call
        for model in ("openai/cheap", llm.model):
            answer = api.post(f"{url}/chat", json={"message": "hi", "model": model})
            assert answer.json()["assistantMessage"] == "echo: hi", answer.text
    for api in api_client(stack.settings):  # not set: any model string, as before...
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        answer = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "hi", "model": "openai/expensive"})
        assert answer.status_code == 200


def test_a_model_string_that_names_a_url_is_refused_unless_listed(stack: Stack, fake_llm: FakeLLM) -> None:
    """litellm's oobabooga/ provider calls the URL in the model string whatever api_base says: any
    key holder could send the whole prompt (system prompt, memory) to any host, past the SSRF guard,
    and read an internal service's answer in the run's error (security review)."""
    elsewhere = f"oobabooga/{fake_llm.server.url}"
    for api in api_client(stack.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        refused = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "hi", "model": elsewhere})
        assert refused.status_code == 422 and "names a URL" in refused.json()["detail"], refused.text
        assert fake_llm.calls() == 0 and api.get(f"/api/v1/conversations/{cid}/messages").json() == []
    llm = stack.settings.llm.model_copy(update={"allowed_models": [elsewhere]})
    assert llm.refuses(elsewhere) is None  # the operator may list one


def test_a_blank_message_title_or_job_is_refused_and_starts_nothing(stack: Stack, api: Any) -> None:
    """"" was refused, but "   " started a model call (and a cron job that would run one each time),
    and a title of spaces was kept."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    sent = [("post", f"/api/v1/conversations/{cid}/chat", {"message": "   "}),
            ("post", f"/api/v1/conversations/{cid}/messages", {"message": "\n\t"}),
            ("post", f"/api/v1/conversations/{cid}/regenerate", {"message": "  "}),
            ("post", "/api/v1/conversations", {"title": " "}),
            ("patch", f"/api/v1/conversations/{cid}", {"title": "   "}),
            ("post", "/api/v1/cron", {"message": "   ", "everySeconds": 600})]
    for method, path, body in sent:
        answer = getattr(api, method)(path, json=body)
        assert answer.status_code == 422 and "blank" in answer.text, (path, body, answer.text[:300])
    assert api.get(f"/api/v1/conversations/{cid}/messages").json() == []
    assert api.get("/api/v1/cron").json() == []
    assert api.get(f"/api/v1/conversations/{cid}").json()["title"] is None
