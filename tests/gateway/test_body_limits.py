"""The REST API's body limits: a message with the most photos of the largest size and the longest
text is taken as documented; a larger body, or a large one to a route that takes no photos, is a 413
naming the exact limit, refused before (or while) the body is read."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from sqlalchemy import text
from starlette.types import Message

from gateway.app import ApiGate, create_app
from gateway.schemas import MAX_BODY, MAX_BODY_WITHOUT_IMAGES, MAX_MESSAGE
from shared.channels.base import MAX_IMAGE, MAX_IMAGES
from shared.db import get_engine
from tests.support.processes import wait_until
from tests.support.stack import API_KEY, Stack

CHUNK = 1024 * 1024


def _jpeg(size: int, seed: int) -> bytes:
    """`size` bytes that read as a JPEG (its magic number first), different for each seed."""
    return (b"\xff\xd8\xff" + bytes([seed]) + bytes(range(256)) * (size // 256 + 1))[:size]


def _sql(stack: Stack, query: str) -> list[Any]:
    with get_engine(stack.settings.database_url).connect() as conn:
        return list(conn.execute(text(query)).scalars())


def test_the_most_photos_at_the_largest_size_with_the_longest_message_are_taken(stack: Stack, api: Any) -> None:
    """Four 5 MiB photos (28 MB as data URLs) and 100,000 characters written as JSON's longest escapes:
    the documented maximum, accepted and answered."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    urls = [f"data:image/jpeg;base64,{base64.b64encode(_jpeg(MAX_IMAGE, i)).decode()}" for i in range(MAX_IMAGES)]
    raw = json.dumps({"message": "\U0001f600" * MAX_MESSAGE, "images": urls}, ensure_ascii=True)
    assert MAX_BODY_WITHOUT_IMAGES < len(raw) <= MAX_BODY
    answer = api.post(f"/api/v1/conversations/{cid}/messages", content=raw,
                      headers={"content-type": "application/json"})
    assert answer.status_code == 202, answer.text[:300]
    assert _sql(stack, "select octet_length(data) from message_images order by 1") == [MAX_IMAGE] * MAX_IMAGES
    run_id = answer.json()["runId"]
    wait_until(lambda: api.get(f"/api/v1/runs/{run_id}").json()["status"] == "succeeded", timeout=60,
               message="the turn to answer the photos")


def test_every_route_that_takes_photos_gets_the_larger_limit(stack: Stack, api: Any) -> None:
    """The routes whose body is ChatIn (the one with `images`), as the OpenAPI schema says, are the
    ones ApiGate lets send MAX_BODY; every other route with a body keeps the smaller limit."""
    paths = api.get("/openapi.json").json()["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if not body:
                continue
            concrete = re.sub(r"\{[^}]+\}", "x1", path)
            takes_images = body.get("$ref", "").endswith("/ChatIn")
            expected = MAX_BODY if takes_images else MAX_BODY_WITHOUT_IMAGES
            assert ApiGate.body_limit(method.upper(), concrete) == expected, (method, path)


async def _call(app: Any, method: str, path: str, *, declared: int | None, chunks: int) -> tuple[int, Any, int]:
    """Send a request straight to the ASGI app: its Content-Length `declared` (none if None), a body of
    `chunks` MiB offered a chunk at a time. (status, JSON answer, chunks the app took)."""
    headers = [(b"authorization", f"Bearer {API_KEY}".encode()), (b"content-type", b"application/json")]
    if declared is not None:
        headers.append((b"content-length", str(declared).encode()))
    scope = {"type": "http", "http_version": "1.1", "method": method, "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "headers": headers, "client": ("127.0.0.1", 1),
             "server": ("testserver", 80), "scheme": "http"}
    taken = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal taken
        if taken == chunks:
            return {"type": "http.disconnect"}
        taken += 1
        return {"type": "http.request", "body": b"a" * CHUNK, "more_body": taken < chunks}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body), taken


def _routes() -> Iterator[Any]:
    large, small = "30 MiB (31,457,280 bytes)", "8 MiB (8,388,608 bytes)"
    yield pytest.param("POST", "/api/v1/conversations/c1/messages", MAX_BODY, large, id="messages")
    yield pytest.param("POST", "/api/v1/conversations/c1/chat", MAX_BODY, large, id="chat")
    yield pytest.param("POST", "/api/v1/conversations/c1/regenerate", MAX_BODY_WITHOUT_IMAGES, small, id="regenerate")
    yield pytest.param("PATCH", "/api/v1/conversations/c1", MAX_BODY_WITHOUT_IMAGES, small, id="rename")


@pytest.mark.parametrize(("method", "path", "limit", "said"), _routes())
def test_a_declared_length_over_the_limit_is_413_before_the_body_is_read(stack: Stack, method: str, path: str,
                                                                         limit: int, said: str) -> None:
    app = create_app(stack.settings)
    status, answer, taken = anyio.run(lambda: _call(app, method, path, declared=limit + 1, chunks=limit // CHUNK + 1))
    assert (status, answer, taken) == (413, {"detail": f"the body is over {said}"}, 0)


@pytest.mark.parametrize(("method", "path", "limit", "said"), _routes())
def test_a_streamed_body_is_refused_once_it_passes_the_limit(stack: Stack, method: str, path: str, limit: int,
                                                            said: str) -> None:
    """No Content-Length: what arrives is counted, and the rest is never taken."""
    app = create_app(stack.settings)
    chunks = limit // CHUNK + 8
    status, answer, taken = anyio.run(lambda: _call(app, method, path, declared=None, chunks=chunks))
    assert (status, answer) == (413, {"detail": f"the body is over {said}"})
    assert taken == limit // CHUNK + 1
