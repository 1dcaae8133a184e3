"""Hostile input at the REST API: NUL bytes, lone surrogates, NaN, numbers past Postgres' bigint,
bodies that are not JSON or too large. Always a clear 4xx, never a 500 (from the database or from
writing the error), and nothing stored."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from gateway.schemas import MAX_BODY
from shared.db import get_engine
from tests.support.stack import Stack


def _count(stack: Stack, table: str) -> int:
    with get_engine(stack.settings.database_url).connect() as conn:
        return int(conn.execute(text(f"select count(*) from {table}")).scalar_one())


@pytest.mark.parametrize("path", ["/api/v1/runs/a%00b", "/api/v1/conversations/a%00b/messages", "/api/v1/files/a%00b",
                                  "/api/v1/runs/" + "x" * 5000])
def test_odd_ids_in_paths_are_4xx(api: Any, path: str) -> None:
    assert 400 <= api.get(path).status_code < 500


def test_nul_bytes_in_bodies_are_refused_and_nothing_is_stored(stack: Stack, api: Any) -> None:
    assert api.post("/api/v1/conversations", json={"title": "a\u0000b"}).status_code == 422
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    for route in ("messages", "chat"):
        assert api.post(f"/api/v1/conversations/{cid}/{route}", json={"message": "hi\u0000"}).status_code == 422
        assert api.post(f"/api/v1/conversations/{cid}/{route}",
                        json={"message": "hi", "model": "m\u0000"}).status_code == 422
    assert _count(stack, "messages") == 0 and _count(stack, "conversations") == 1


def test_offsets_past_bigint_are_422(api: Any) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    assert api.get(f"/api/v1/conversations/{cid}/messages", params={"offset": 2**63}).status_code == 422
    assert api.get(f"/api/v1/conversations/{cid}/messages", params={"offset": 2**63 - 1}).json() == []


@pytest.mark.parametrize("body", [b"\xff\xfe{", b"{" * 100_000, b'{"message": 1}', b"", b"[]"])
def test_bodies_that_are_not_the_model_are_4xx(stack: Stack, api: Any, body: bytes) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    for route in ("messages", "chat"):
        r = api.post(f"/api/v1/conversations/{cid}/{route}", content=body, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, r.text
    assert _count(stack, "messages") == 0


def _post_raw(api: Any, path: str, raw: bytes | str, method: str = "POST") -> Any:
    return api.request(method, path, content=raw, headers={"content-type": "application/json"})


@pytest.mark.parametrize(("field", "escape"), [("message", r"\ud800"), ("message", r"x\udc00y"),
                                              ("model", r"\ud83d")])
def test_lone_surrogates_in_messages_are_422(stack: Stack, api: Any, field: str, escape: str) -> None:
    """JSON may spell a lone UTF-16 surrogate; Python keeps it, UTF-8 (and Postgres) cannot: a 422
    that says so, as valid JSON, and nothing stored."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    body = {"message": "hi", "model": None, field: "PLACEHOLDER"}
    raw = json.dumps(body).replace("PLACEHOLDER", escape)
    for route in ("messages", "chat"):
        answer = _post_raw(api, f"/api/v1/conversations/{cid}/{route}", raw)
        assert answer.status_code == 422, answer.text[:300]
        assert answer.json()["detail"][0]["loc"] == ["body", field]
    assert _count(stack, "messages") == 0


@pytest.mark.parametrize(("method", "path", "raw"), [
    ("POST", "/api/v1/conversations", r'{"title": "\udc00"}'),
    ("POST", "/api/v1/cron", r'{"message": "\ud800", "everySeconds": 60}'),
    ("PATCH", "/api/v1/cron/some-job", r'{"name": "\ud800"}'),
    ("POST", "/api/v1/conversations", '{"title": NaN}'),
    ("POST", "/api/v1/cron", '{"message": "hi", "everySeconds": Infinity}'),
])
def test_input_json_cannot_echo_back_is_still_a_422(stack: Stack, api: Any, method: str, path: str,
                                                     raw: str) -> None:
    """Surrogates and NaN/Infinity (Python's json accepts both) in any body: a 422, never a 500 from
    writing the error that echoes them."""
    before = _count(stack, "conversations"), _count(stack, "cron_jobs")
    answer = _post_raw(api, path, raw, method)
    assert answer.status_code == 422, answer.text[:300]
    assert answer.json()["detail"]
    assert (_count(stack, "conversations"), _count(stack, "cron_jobs")) == before


def test_a_422_does_not_echo_a_large_input(api: Any) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    answer = api.post(f"/api/v1/conversations/{cid}/messages", json={"message": "x" * 900_000})
    assert answer.status_code == 422
    assert len(answer.content) < 2_000, len(answer.content)
    assert answer.json()["detail"][0]["type"] == "string_too_long"


def test_bodies_over_the_limit_are_413_and_nothing_is_stored(stack: Stack, api: Any) -> None:
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    huge = b'{"message": "' + b"a" * (MAX_BODY + 1024 * 1024) + b'"}'
    assert _post_raw(api, f"/api/v1/conversations/{cid}/chat", huge).status_code == 413

    def streamed() -> Iterator[bytes]:  # no Content-Length: the limit counts what arrives
        yield b'{"message": "'
        for _ in range(MAX_BODY // (64 * 1024) + 16):
            yield b"a" * 64 * 1024
        yield b'"}'

    answer = api.post(f"/api/v1/conversations/{cid}/messages", content=streamed(),
                      headers={"content-type": "application/json"})
    assert answer.status_code == 413, answer.text[:300]
    assert _count(stack, "messages") == 0


def test_the_longest_message_fits_under_the_limit_however_it_is_escaped(stack: Stack, api: Any) -> None:
    """100,000 characters is the most a message may hold; written as JSON \\u escapes of characters
    outside the BMP (12 bytes each) it is 1.2 MB, and still accepted."""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    raw = json.dumps({"message": "\U0001f600" * 100_000}, ensure_ascii=True)
    answer = _post_raw(api, f"/api/v1/conversations/{cid}/messages", raw)
    assert answer.status_code == 202, answer.text[:300]


@pytest.mark.parametrize("path", ["/api/v1/outbox/a%00b/retry", "/api/v1/outbox/" + "x" * 5000 + "/retry",
                                  "/api/v1/runs/a%00b/cancel", "/api/v1/subagents/a%00b/cancel",
                                  "/api/v1/conversations/a%00b/chat", "/api/v1/cron/a%00b"])
def test_odd_ids_in_post_paths_are_422(api: Any, path: str) -> None:
    method = "PATCH" if "/cron/" in path else "POST"
    answer = api.request(method, path, json={"message": "hi"})
    assert answer.status_code == 422, answer.text[:300]
