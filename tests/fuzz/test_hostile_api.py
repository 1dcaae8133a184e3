"""Hostile input at the REST API: NUL bytes, numbers past Postgres' bigint, bodies that are not
JSON. Always a clear 4xx, never a database error surfacing as a 500, and nothing stored."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from shared.db import get_engine
from tests.support.stack import Stack


def _count(stack: Stack, table: str) -> int:
    with get_engine(stack.settings.database_url).connect() as conn:
        return int(conn.execute(text(f"select count(*) from {table}")).scalar_one())


@pytest.mark.parametrize("path", ["/api/v1/runs/a%00b", "/api/v1/conversations/a%00b/messages",
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
