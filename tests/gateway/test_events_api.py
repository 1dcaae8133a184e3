"""The SSE endpoint's answers before a stream starts: a bad Last-Event-ID, an unknown conversation,
and no Redis connection free. Each is a clear 4xx/503 instead of a stream that breaks or never ends.
And how a stream ends in a real gateway process: quietly when the gateway shuts down or the
conversation is deleted, with an error in its log when Redis goes away under it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.embedded import start_redis
from gateway.state import async_redis
from shared.agent.events import RUN_FAILED, TEXT_DELTA, RedisEvents, stream_key, watch_key
from shared.agent.events import read as read_events
from tests.support.processes import wait_until
from tests.support.stack import API_KEY, Stack, gateway_process


def _open(api: Any, path: str, headers: Mapping[str, str | bytes] | None = None) -> tuple[int, str]:
    """Status and, for anything but a stream, the body (a stream is left unread)."""
    with api.stream("GET", path, headers=headers or {}) as answer:
        return answer.status_code, "" if answer.status_code == 200 else answer.read().decode()


@pytest.mark.parametrize("last_id", ["garbage", "1-", "-1", "1-2-3", "$", "\u00b2".encode("latin-1"), "1" * 21,
                                     "18446744073709551616-0", "1-18446744073709551616"])
def test_a_malformed_last_event_id_is_400(stack: Stack, api: Any, last_id: str | bytes) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    status, body = _open(api, f"/api/v1/conversations/{cid}/events", {"Last-Event-ID": last_id})
    assert status == 400, body
    assert "Last-Event-ID" in body


@pytest.mark.parametrize("last_id", ["0", "0-0", "1718000000000-0", "1718000000000", "18446744073709551615-5"])
def test_stream_ids_redis_takes_are_accepted(stack: Stack, api: Any, last_id: str) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    assert _open(api, f"/api/v1/conversations/{cid}/events", {"Last-Event-ID": last_id})[0] == 200


@pytest.mark.parametrize("headers", [{}, {"Last-Event-ID": "0"}])
def test_an_unknown_conversation_is_404_and_not_watched(stack: Stack, api: Any, headers: dict[str, str]) -> None:
    status, body = _open(api, "/api/v1/conversations/no-such-conversation/events", headers)
    assert status == 404 and "no conversation" in body
    client = redis.Redis.from_url(stack.settings.redis_url)
    assert not client.exists(watch_key("no-such-conversation"))


def test_with_every_redis_connection_in_use_a_stream_is_503(stack: Stack) -> None:
    """The gateway's Redis pool is full (each open stream holds a connection while it waits): a new
    stream waits a moment for one, then gets a 503 that says why; once one is free, streams open."""
    app = create_app(stack.settings)
    state = app.state.nanofleet
    state.aredis = async_redis(stack.settings.redis_url, connections=1, wait=0.1)
    with TestClient(app, headers={"Authorization": f"Bearer {API_KEY}"}) as api:
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        pool = state.aredis.connection_pool
        held = api.portal.call(pool.get_connection)  # type: ignore[union-attr]
        status, body = _open(api, f"/api/v1/conversations/{cid}/events")
        assert status == 503, body
        assert "Redis" in body and "try again" in body
        api.portal.call(pool.release, held)  # type: ignore[union-attr]
        assert _open(api, f"/api/v1/conversations/{cid}/events")[0] == 200


def test_past_the_stream_limit_a_new_stream_is_503_until_one_closes(stack: Stack, api: Any) -> None:
    state = api.app.state.nanofleet
    state.max_streams = 1
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    path = f"/api/v1/conversations/{cid}/events"
    with api.stream("GET", path) as first:
        assert first.status_code == 200
        status, body = _open(api, path)
        assert status == 503 and "too many open event streams" in body, body
    wait_until(lambda: state.streams == 0, timeout=30, message="the first stream to end")
    assert _open(api, path)[0] == 200


def test_a_quiet_stream_outlasts_a_blocking_read(stack: Stack, api: Any) -> None:
    """A stream waits up to 15 s per read; the read must not time out first (redis-py's default
    socket timeout is 5 s), or every stream quiet for 5 s would be cut off."""
    state = api.app.state.nanofleet
    assert api.portal.call(read_events, state.aredis, "quiet-conversation", "$", 6_000) == []


def _live_stream(s: Stack, cid: str, lines: Iterator[str]) -> None:
    """Publish an event and read it from `lines`: the stream is live, waiting for the next one."""
    with redis.Redis.from_url(s.settings.redis_url) as client:
        client.xadd(stream_key(cid), {"event": "probe", "data": "{}"})
    assert "event: probe" in (line for line in lines)


def _errors(log: str) -> list[str]:
    """The log's lines at ERROR or above, and any traceback."""
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    bad = [r["message"] for r in records if r.get("level") in ("ERROR", "CRITICAL")]
    return bad + (["a traceback"] if "Traceback" in log else [])


@contextlib.contextmanager
def _reading(s: Stack) -> Iterator[tuple[Any, httpx.Client, str, Iterator[str]]]:
    """A gateway process, its client, a new conversation and the lines of its live event stream."""
    with gateway_process(s) as (proc, client):
        cid = client.post("/api/v1/conversations").json()["conversationId"]
        with client.stream("GET", f"/api/v1/conversations/{cid}/events") as answer:
            lines = answer.iter_lines()
            _live_stream(s, cid, lines)
            yield proc, client, cid, lines


def test_a_gateway_stopping_ends_an_open_stream_quietly(make_stack) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM (`docker compose stop`, a rolling deploy) with a client reading a stream: the stream
    ends properly (the client reads to its end, not into a body cut short), and the gateway exits
    without an error in its log."""
    s: Stack = make_stack()
    with _reading(s) as (proc, _, _, lines):
        os.killpg(proc.pid, signal.SIGTERM)
        list(lines)  # httpx.RemoteProtocolError on a body that never ended
        assert proc.popen.wait(30) in (0, -signal.SIGTERM), proc.log()
    assert _errors(proc.log()) == [], proc.log()


def test_a_stream_of_a_deleted_conversation_ends(make_stack) -> None:  # type: ignore[no-untyped-def]
    """A reader of a conversation deleted meanwhile (the web chat in another tab) gets a last
    `conversation.deleted` event and the end of the stream, not pings for as long as it stays."""
    s: Stack = make_stack()
    with _reading(s) as (_, client, cid, lines):
        assert client.delete(f"/api/v1/conversations/{cid}").status_code == 204
        deadline, rest = time.monotonic() + 20, []  # a ping comes every 15 s while the stream is open
        for line in lines:
            rest.append(line)
            assert time.monotonic() < deadline, f"the stream went on after the deletion: {rest}"
        assert "event: conversation.deleted" in rest, rest
        assert _open(client, f"/api/v1/conversations/{cid}/events")[0] == 404


def test_a_stream_whose_redis_goes_away_is_an_error_in_the_log(make_stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A real fault while streaming is not mistaken for a shutdown: it is logged as an error."""
    own_redis = start_redis(tmp_path)
    try:
        s: Stack = make_stack(REDIS_URL=own_redis.url)
        with gateway_process(s) as (proc, client):
            cid = client.post("/api/v1/conversations").json()["conversationId"]
            with client.stream("GET", f"/api/v1/conversations/{cid}/events") as answer:
                lines = answer.iter_lines()
                _live_stream(s, cid, lines)
                own_redis.stop()
                with contextlib.suppress(httpx.HTTPError):
                    list(lines)
            wait_until(lambda: _errors(proc.log()), timeout=60, message="the gateway to log the stream's error")
            assert proc.alive(), proc.log()
    finally:
        own_redis.stop()


def test_text_a_stopped_run_streams_after_its_end_is_not_sent(stack: Stack, api: Any) -> None:
    """The model call of a stopped run is not cut short: its text deltas went on after run.failed,
    and a client added them to a turn it had been told was over. Another run's text goes through."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    sink = RedisEvents(redis.Redis.from_url(stack.settings.redis_url, decode_responses=True))
    for event, data in ((TEXT_DELTA, {"run_id": "r1", "text": "before"}), (RUN_FAILED, {"run_id": "r1"}),
                        (TEXT_DELTA, {"run_id": "r1", "text": "late"}), (TEXT_DELTA, {"run_id": "r2", "text": "next"})):
        sink.publish(cid, event, data)
    seen: list[tuple[str, str]] = []
    with api.stream("GET", f"/api/v1/conversations/{cid}/events", headers={"Last-Event-ID": "0"}) as answer:
        event = ""
        for line in answer.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                seen.append((event, json.loads(line.removeprefix("data: ")).get("text", "")))
                if seen[-1] == (TEXT_DELTA, "next"):
                    break
    assert seen == [(TEXT_DELTA, "before"), (RUN_FAILED, ""), (TEXT_DELTA, "next")]
