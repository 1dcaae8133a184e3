"""The API when Postgres or Redis fails after a message is stored: a 503 says nothing was sent (and
invites a retry that would send it twice), so a stored message gets a 202, an answer, or a 504 that
names the run. And a Redis that accepts connections but never answers is a 503 before anything is
sent, as one that refuses them, not a 500 half a minute later."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from sqlmodel import Session, select

from shared.db import get_engine
from shared.models import TERMINAL, Message, Run, RunStatus
from tests.support.processes import wait_until
from tests.support.proxy import FORWARD, HANG, REFUSE, proxy_to
from tests.support.stack import Stack, api_client

gateway = contextmanager(api_client)  # the app in-process; unlike a loop over it, closed when a test fails


def _stored(s: Stack, cid: str) -> str | None:
    """The id of the run the conversation's message started, read past any proxy, once both are stored."""
    with Session(get_engine(s.settings.database_url)) as db:
        if db.exec(select(Message.id).where(Message.conversation_id == cid)).first() is None:
            return None
        return db.exec(select(Run.id).where(Run.conversation_id == cid)).first()


def _chat_through(api: Any, s: Stack, proxy: Any, mode: str, message: str = "hi",
                  meanwhile: Callable[[Future[Any], str], None] = lambda waiting, run_id: None) -> tuple[str, str, Any]:
    """A /chat whose message is stored, then the proxy turned to `mode` (and `meanwhile` done while
    it waits): the conversation, the run, and the answer."""
    with ThreadPoolExecutor(1) as pool:
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        waiting = pool.submit(api.post, f"/api/v1/conversations/{cid}/chat", json={"message": message})
        run_id = str(wait_until(lambda: _stored(s, cid), timeout=30, message="the message to be stored"))
        proxy.set(mode)
        meanwhile(waiting, run_id)
        return cid, run_id, waiting.result(timeout=60)


def _ended(s: Stack, run_id: str) -> bool:
    with Session(get_engine(s.settings.database_url)) as db:
        run = db.get(Run, run_id)
        return run is not None and run.status in TERMINAL


def test_a_database_blip_while_a_chat_waits_is_waited_out(make_stack: Callable[..., Stack]) -> None:
    """Postgres refusing the gateway for a while after the message is stored: the chat keeps waiting
    and answers once it can read the end (it answered 503, "nothing was sent", at the first read)."""
    s = make_stack()  # no worker yet: the run waits until the database has failed the waiter

    def refused_then_back(waiting: Future[Any], run_id: str) -> None:
        wait_until(lambda: waiting.done() or proxy.refused >= 2, timeout=30,
                   message="the waiter to find the database down")
        assert not waiting.done(), waiting.result().text  # it waits on, whatever it reads
        s.worker()
        wait_until(lambda: _ended(s, run_id), timeout=60, message="the run to end")
        proxy.set(FORWARD)

    with proxy_to(s.settings.database_url) as proxy, \
            gateway(s.settings.model_copy(update={"database_url": proxy.url(s.settings.database_url)})) as api:
        _, run_id, answer = _chat_through(api, s, proxy, REFUSE, meanwhile=refused_then_back)
    assert answer.status_code == 200, answer.text
    assert answer.json()["assistantMessage"] == "echo: hi" and answer.json()["runId"] == run_id


def test_a_chat_whose_database_stays_down_answers_504_naming_the_run(make_stack: Callable[..., Stack]) -> None:
    s = make_stack()  # no worker: the run never ends
    agent = s.settings.agent.model_copy(update={"chat_timeout": 3.0})
    with proxy_to(s.settings.database_url) as proxy, gateway(s.settings.model_copy(update={
            "database_url": proxy.url(s.settings.database_url), "agent": agent})) as api:
        cid, run_id, answer = _chat_through(api, s, proxy, REFUSE)
    assert answer.status_code == 504, answer.text
    body = answer.json()
    assert body["conversationId"] == cid and body["runId"] == run_id
    assert f"GET /api/v1/runs/{run_id}" in body["detail"]


def test_a_chat_goes_on_when_redis_stops_answering(make_stack: Callable[..., Stack]) -> None:
    """Redis taking connections and answering nothing once the message is stored: the wait tells the
    end from Postgres, as when Redis refuses connections (it was a 500 after Redis' 30 s read timeout)."""
    s = make_stack()
    s.worker()
    s.beat()  # the sweeper enqueues the run if the gateway's send did not get through
    with proxy_to(s.settings.redis_url) as proxy, \
            gateway(s.settings.model_copy(update={"redis_url": proxy.url(s.settings.redis_url)})) as api:
        _, run_id, answer = _chat_through(api, s, proxy, HANG, message="sleep:2")
        assert proxy.held > 0  # the wait did read through the hung proxy
    assert answer.status_code == 200, answer.text
    assert answer.json()["assistantMessage"] == "echo: sleep:2" and answer.json()["runId"] == run_id


def test_a_redis_that_stops_answering_is_a_503(make_stack: Callable[..., Stack]) -> None:
    """/help and the event stream need Redis before anything is sent: a 503 to try again, as when it
    refuses connections (they were a 500 after 30 s)."""
    s = make_stack()
    with (ThreadPoolExecutor(1) as pool, proxy_to(s.settings.redis_url) as proxy,
          gateway(s.settings.model_copy(update={"redis_url": proxy.url(s.settings.redis_url)})) as api):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        proxy.set(HANG)
        asked: list[tuple[str, Any]] = [
            ("/help", pool.submit(api.post, f"/api/v1/conversations/{cid}/chat", json={"message": "/help"})),
            ("events", pool.submit(api.get, f"/api/v1/conversations/{cid}/events")),
        ]
        for what, future in asked:
            answer = future.result(timeout=60)
            assert answer.status_code == 503, (what, answer.text)
            assert "Redis" in answer.json()["detail"] and answer.headers["Retry-After"] == "5"
        assert api.get(f"/api/v1/conversations/{cid}/messages").json() == []  # nothing was sent


def test_a_message_posted_while_redis_stops_answering_is_accepted_and_answered(
        make_stack: Callable[..., Stack]) -> None:
    """The send to a Redis that never answers gives up within seconds: the message is stored, the
    client gets its 202, and the sweeper enqueues the run (the send held the request ~100 s)."""
    s = make_stack()
    s.worker()
    s.beat()
    with (ThreadPoolExecutor(1) as pool, proxy_to(s.settings.redis_url) as proxy,
          gateway(s.settings.model_copy(update={"redis_url": proxy.url(s.settings.redis_url)})) as api):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        proxy.set(HANG)
        posting = pool.submit(api.post, f"/api/v1/conversations/{cid}/messages", json={"message": "while hung"})
        posted = posting.result(timeout=30)
        assert posted.status_code == 202, posted.text
        run_id = posted.json()["runId"]
        assert run_id == _stored(s, cid)
        wait_until(lambda: _ended(s, run_id), timeout=60, message="the sweeper to start the run")
        run = api.get(f"/api/v1/runs/{run_id}").json()
        assert run["status"] == RunStatus.SUCCEEDED.value and run["result"] == "echo: while hung"
