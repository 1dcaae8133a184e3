"""Webhooks are answered before FastAPI routes anything (gateway/routes/webhooks.py FastPath): the
same answers, request ids and access lines as every other request, behind a proxy's root path too;
every other request goes on to FastAPI."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gateway import app
from gateway.routes.webhooks import platform_of
from shared.logs import ContextFilter
from shared.settings import Settings, load_settings
from tests.fakes.server import free_port
from tests.support.stack import API_KEY, api_client

SECRET = "fast-path-secret-0123456789"


def _scope(method: str, path: str, root_path: str = "") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": root_path}


@pytest.mark.parametrize(("method", "path", "root_path", "platform"), [
    ("POST", "/webhooks/telegram", "", "telegram"),
    ("POST", "/webhooks/discord", "", "discord"),
    ("POST", "/bot/webhooks/slack", "/bot", "slack"),  # behind a proxy that strips nothing
    ("POST", "/webhooks/slack", "/bot", "slack"),  # behind one that strips its prefix
    ("GET", "/webhooks/whatsapp", "", None),  # Meta's handshake is FastAPI's route
    ("POST", "/webhooks/telegram/", "", None),  # FastAPI redirects it
    ("POST", "/webhooks/nosuch", "", None),
    ("POST", "/api/v1/conversations", "", None),
])
def test_only_a_platforms_webhook_takes_the_fast_path(method: str, path: str, root_path: str,
                                                      platform: str | None) -> None:
    assert platform_of(_scope(method, path, root_path)) == platform


def _settings(tmp_path: Path) -> Settings:
    return load_settings(workspace=tmp_path, api_keys=[API_KEY], channels={
        "telegram": {"token": "123:abc", "webhook_secret": SECRET, "allow_from": ["*"]}})


def test_a_webhook_keeps_its_request_id_access_line_and_answers(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(ContextFilter())
    for client in api_client(_settings(tmp_path)):
        with caplog.at_level(logging.INFO, logger="gateway"):
            forged = client.post("/webhooks/telegram", json={"update_id": 1},
                                 headers={"x-request-id": "trace-webhook-1", "x-telegram-bot-api-secret-token": "no"})
            unknown = client.post("/webhooks/telegram", json={"update_id": 2, "poll": {}},
                                  headers={"x-telegram-bot-api-secret-token": SECRET})
            off = client.post("/webhooks/slack", json={})
            handshake = client.get("/webhooks/telegram")
    assert (forged.status_code, forged.headers["x-request-id"]) == (401, "trace-webhook-1")
    assert unknown.status_code == 200 and unknown.json() == {"ok": True}  # an event it ignores: nothing to store
    assert off.status_code == 404 and "SLACK" in off.json()["detail"]  # names what to set
    assert handshake.status_code == 405  # no GET route for Telegram: FastAPI's answer
    lines = {r.getMessage().rsplit(" ", 1)[0]: r for r in caplog.records if r.name == "gateway"}
    assert lines["POST /webhooks/telegram 401"].request_id == "trace-webhook-1"  # type: ignore[attr-defined]
    assert {"POST /webhooks/telegram 200", "POST /webhooks/slack 404", "GET /webhooks/telegram 405"} <= set(lines)


def test_a_platforms_answered_webhooks_get_one_line_a_second_that_counts_the_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app, "WEBHOOK_LINE_EVERY", 3600.0)
    ignored = {"update_id": 3, "poll": {}}
    headers = {"x-telegram-bot-api-secret-token": SECRET}
    for client in api_client(_settings(tmp_path)):
        with caplog.at_level(logging.DEBUG, logger="gateway"):
            answers = [client.post("/webhooks/telegram", json=ignored, headers=headers).status_code for _ in range(3)]
            forged = client.post("/webhooks/telegram", json=ignored).status_code
            monkeypatch.setattr(app, "WEBHOOK_LINE_EVERY", 0.0)
            answers.append(client.post("/webhooks/telegram", json=ignored, headers=headers).status_code)
    assert answers == [200] * 4 and forged == 401
    lines = [(r.levelname, r.getMessage().split("ms", 1)[-1], r.getMessage().split()[2]) for r in caplog.records
             if r.name == "gateway" and r.getMessage().startswith("POST /webhooks/telegram ")]
    assert lines == [("INFO", "", "200"), ("DEBUG", "", "200"), ("DEBUG", "", "200"),
                     ("INFO", "", "401"),  # a refusal always has its line
                     ("INFO", " (and 2 more answered since the last line)", "200")]


def test_a_request_that_meets_the_database_down_gets_a_503_to_try_again(tmp_path: Path) -> None:
    """A webhook (its platform sends it again) and an API call alike; both were 500s with a traceback."""
    down = _settings(tmp_path).model_copy(
        update={"database_url": f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/none"})
    message = {"update_id": 4, "message": {"message_id": 1, "date": 0, "chat": {"id": 5, "type": "private"},
                                           "from": {"id": 6, "is_bot": False, "first_name": "A"}, "text": "hi"}}
    for client in api_client(down):
        webhook = client.post("/webhooks/telegram", json=message, headers={"x-telegram-bot-api-secret-token": SECRET})
        api = client.post("/api/v1/conversations")
    for answer in (webhook, api):
        assert answer.status_code == 503 and answer.headers["retry-after"] == "5", answer.text
        assert "database is unavailable" in answer.json()["detail"]
