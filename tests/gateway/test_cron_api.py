"""`/api/v1/cron`: create, list, show, change and delete jobs; the beat mirror follows each change."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from fastapi.testclient import TestClient

from shared.agent import conversations
from shared.models import utcnow
from shared.scheduling import jobs
from shared.scheduling.beat import BeatMirror, beat_app
from tests.support.scheduling import TELEGRAM, client, db
from tests.support.stack import Stack


def mirror(stack: Stack) -> BeatMirror:
    return BeatMirror(beat_app(stack.settings))


@pytest.fixture
def telegram_api(make_stack: Callable[..., Stack]) -> Iterator[tuple[Stack, Any]]:
    """The gateway of a stack with Telegram configured (no processes)."""
    stack = make_stack(**TELEGRAM)
    with client(stack) as api:
        yield stack, api


def test_create_list_change_delete(telegram_api: tuple[Stack, Any]) -> None:
    stack, api = telegram_api
    r = api.post("/api/v1/cron", json={"message": "stand-up notes", "cronExpr": "0  9 * * 1-5",
                                       "tz": "Europe/Paris", "channel": "telegram", "chatId": "42"})
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["kind"], job["cronExpr"], job["missedPolicy"], job["enabled"]) == ("cron", "0 9 * * 1-5", "skip", True)
    next_run = datetime.fromisoformat(job["nextRunAt"])
    assert next_run.astimezone(UTC) > datetime.now(UTC)
    assert next_run.astimezone(ZoneInfo("Europe/Paris")).hour == 9
    assert mirror(stack).is_armed_for(job["id"], next_run)

    at = api.post("/api/v1/cron", json={"message": "once", "at": (datetime.now(UTC) + timedelta(hours=1)).isoformat()})
    assert at.json()["missedPolicy"] == "run_once"  # a one-shot still runs if beat was down at its time
    listed = api.get("/api/v1/cron", params={"channel": "telegram", "chatId": "42"}).json()
    assert [j["id"] for j in listed] == [job["id"]]
    assert {j["id"] for j in api.get("/api/v1/cron").json()} == {job["id"], at.json()["id"]}
    assert api.get(f"/api/v1/cron/{job['id']}").json()["firings"] == []

    off = api.patch(f"/api/v1/cron/{job['id']}", json={"enabled": False}).json()
    assert off["enabled"] is False and off["nextRunAt"] is None and mirror(stack).armed(job["id"]) is None
    every = api.patch(f"/api/v1/cron/{job['id']}", json={"enabled": True, "everySeconds": 90}).json()
    assert (every["kind"], every["everySeconds"], every["cronExpr"]) == ("every", 90, None)
    assert mirror(stack).is_armed_for(job["id"], datetime.fromisoformat(every["nextRunAt"]))

    assert api.delete(f"/api/v1/cron/{job['id']}").status_code == 204
    assert api.get(f"/api/v1/cron/{job['id']}").status_code == 404
    assert api.delete(f"/api/v1/cron/{job['id']}").status_code == 404
    assert mirror(stack).armed(job["id"]) is None


def test_invalid_jobs_are_refused_with_the_reason(stack: Stack, api: Any) -> None:
    cases = [
        ({"message": "x", "everySeconds": 5, "cronExpr": "* * * * *"}, "exactly one"),
        ({"message": "x"}, "exactly one"),
        ({"message": "x", "cronExpr": "61 * * * *"}, "minute '61' is out of range (0-59)"),
        ({"message": "x", "cronExpr": "0 9 * *"}, "has 4 fields; a cron expression has 5"),
        ({"message": "x", "cronExpr": "0 9 * * *", "tz": "Mars/Olympus"}, "unknown timezone"),
        ({"message": "x", "at": "2001-01-01T00:00:00Z"}, "in the past"),
        ({"message": "x", "everySeconds": 0}, "greater than or equal to 1"),
        ({"message": "x", "cronExpr": "0 0 31 2 *"}, "no fire time"),
    ]
    for body, reason in cases:
        r = api.post("/api/v1/cron", json=body)
        assert r.status_code == 422 and reason in r.text, (body, r.text)
    assert api.get("/api/v1/cron").json() == []
    assert api.get("/api/v1/cron", params={"chat_id": "42"}).status_code == 422  # a misspelt filter lists nothing
    job = api.post("/api/v1/cron", json={"message": "x", "everySeconds": 60}).json()
    for message, reason in (("x" * 10_001, "at most 10000 characters"), (" ", "it is blank")):  # not "items"
        r = api.patch(f"/api/v1/cron/{job['id']}", json={"message": message})
        assert r.status_code == 422 and reason in r.text, r.text


def test_cron_needs_an_api_key(stack: Stack) -> None:
    from gateway.app import create_app

    with TestClient(create_app(stack.settings)) as anonymous:
        assert anonymous.get("/api/v1/cron").status_code == 401
        assert anonymous.post("/api/v1/cron", json={"message": "x", "everySeconds": 5}).status_code == 401


def test_a_time_out_of_range_is_refused(stack: Stack, api: Any) -> None:
    for at in ("9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59"):
        r = api.post("/api/v1/cron", json={"message": "x", "at": at, "tz": "America/New_York"})
        assert r.status_code == 422 and "out of range" in r.text, (at, r.text)
    far = (datetime.now(UTC) + timedelta(days=11 * 366)).isoformat()
    r = api.post("/api/v1/cron", json={"message": "x", "at": far})
    assert r.status_code == 422 and "too far ahead" in r.text
    jid = api.post("/api/v1/cron", json={"message": "x", "everySeconds": 60}).json()["id"]
    r = api.patch(f"/api/v1/cron/{jid}", json={"at": "9999-12-31T23:00:00-05:00"})
    assert r.status_code == 422 and "out of range" in r.text
    assert api.get(f"/api/v1/cron/{jid}").json()["kind"] == "every"


def test_results_must_have_somewhere_to_go(telegram_api: tuple[Stack, Any]) -> None:
    """Every firing of a job nothing can deliver would pay for a run whose reply is lost."""
    _, api = telegram_api
    cases = [
        ({"channel": "nonexistent", "chatId": "1"}, "unknown channel 'nonexistent'"),
        ({"channel": "slack", "chatId": "C1"}, "'slack' is not configured here: set NANOFLEET_CHANNELS__SLACK__"),
        ({"channel": "telegram", "chatId": ""}, "needs a chat_id"),
        ({"channel": "telegram", "chatId": "  "}, "needs a chat_id"),
    ]
    for target, reason in cases:
        r = api.post("/api/v1/cron", json={"message": "x", "everySeconds": 60, **target})
        assert r.status_code == 422 and reason in r.text, (target, r.text)
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    for target in ({"channel": "telegram", "chatId": "42"}, {"channel": "api", "chatId": cid}, {}):
        assert api.post("/api/v1/cron", json={"message": "x", "everySeconds": 60, **target}).status_code == 201
    jid = api.post("/api/v1/cron", json={"message": "x", "everySeconds": 60}).json()["id"]
    for target, reason in [*cases[:3], ({"channel": "telegram"}, "needs a chat_id")]:
        r = api.patch(f"/api/v1/cron/{jid}", json=target)
        assert r.status_code == 422 and reason in r.text, (target, r.text)
    assert api.patch(f"/api/v1/cron/{jid}", json={"channel": "telegram", "chatId": "42"}).status_code == 200
    assert len(api.get("/api/v1/cron", params={"channel": "telegram", "chatId": "42"}).json()) == 2


def test_a_one_shot_whose_time_passed_while_disabled_needs_a_new_time(stack: Stack, api: Any) -> None:
    """Enabled as it was, it would never fire and never be removed."""
    now = utcnow()
    with db(stack) as s:  # made five minutes ago, disabled, to run three minutes ago
        jid = jobs.create(s, stack.settings, jobs.JobIn(message="x", at=now - timedelta(minutes=3), enabled=False),
                          now=now - timedelta(minutes=5)).id
    r = api.patch(f"/api/v1/cron/{jid}", json={"enabled": True})
    assert r.status_code == 422 and "give it a new `at`" in r.text
    assert api.get(f"/api/v1/cron/{jid}").json()["enabled"] is False
    at = (now + timedelta(hours=1)).replace(microsecond=0)
    r = api.patch(f"/api/v1/cron/{jid}", json={"enabled": True, "at": at.isoformat()})
    assert r.status_code == 200 and r.json()["nextRunAt"] == at.astimezone(UTC).isoformat()
    assert mirror(stack).is_armed_for(jid, at)


def test_tz_is_checked_and_refused_where_it_means_nothing(stack: Stack, api: Any) -> None:
    every = api.post("/api/v1/cron", json={"message": "x", "everySeconds": 60}).json()
    at = api.post("/api/v1/cron", json={"message": "x", "at": (utcnow() + timedelta(hours=1)).isoformat()}).json()
    daily = api.post("/api/v1/cron", json={"message": "x", "cronExpr": "0 9 * * *", "tz": "UTC"}).json()
    for job in (every, at, daily):
        r = api.patch(f"/api/v1/cron/{job['id']}", json={"tz": "Bad/Zone"})
        assert r.status_code == 422 and "unknown timezone" in r.text
    for job in (every, at):
        r = api.patch(f"/api/v1/cron/{job['id']}", json={"tz": "Europe/Paris"})
        assert r.status_code == 422 and "tz applies only to cron expressions" in r.text
        assert api.get(f"/api/v1/cron/{job['id']}").json()["tz"] == job["tz"]
    r = api.patch(f"/api/v1/cron/{daily['id']}", json={"tz": "Asia/Tokyo"})
    assert r.status_code == 200 and datetime.fromisoformat(r.json()["nextRunAt"]).astimezone(
        ZoneInfo("Asia/Tokyo")).hour == 9
    r = api.post("/api/v1/cron", json={"message": "x", "everySeconds": 60, "tz": "Europe/Paris"})
    assert r.status_code == 422 and "tz applies only to cron expressions" in r.text
    naive = (utcnow() + timedelta(days=1)).replace(tzinfo=None, hour=9, minute=0, second=0, microsecond=0)
    moved = api.patch(f"/api/v1/cron/{at['id']}", json={"at": naive.isoformat(), "tz": "Asia/Tokyo"}).json()
    assert datetime.fromisoformat(moved["at"]).astimezone(ZoneInfo("Asia/Tokyo")).hour == 9


def test_an_api_chat_id_must_name_a_conversation(stack: Stack, api: Any) -> None:
    """A mistyped conversation id would have each firing's result reach nobody, without a word."""
    typo = {"message": "x", "everySeconds": 60, "chatId": "doesnotexist"}
    r = api.post("/api/v1/cron", json=typo)
    assert r.status_code == 422, r.text
    assert "no conversation 'doesnotexist'" in r.json()["detail"] and "POST /api/v1/conversations" in r.text
    assert "leave chat_id out" in r.text
    jid = api.post("/api/v1/cron", json={"message": "x", "everySeconds": 60}).json()["id"]  # no chat id: its session
    r = api.patch(f"/api/v1/cron/{jid}", json={"chatId": "doesnotexist"})
    assert r.status_code == 422 and "no conversation 'doesnotexist'" in r.text
    assert api.get(f"/api/v1/cron/{jid}").json()["chatId"] == ""
    cid = api.post("/api/v1/conversations").json()["conversationId"]
    with db(stack) as s:  # `nanofleet agent`: its cron tool sets the session key as the chat id
        conversations.get_or_create(s, session_key="cli:default", channel="cli", chat_id="cli:default")
    for chat_id in (cid, "cli:default", ""):
        r = api.post("/api/v1/cron", json={**typo, "chatId": chat_id})
        assert r.status_code == 201 and r.json()["chatId"] == chat_id, r.text
        assert api.patch(f"/api/v1/cron/{jid}", json={"chatId": chat_id}).status_code == 200


def test_unknown_keys_are_refused_by_name(stack: Stack, api: Any) -> None:
    """A misspelt key left its field at the default: "chanel" made a job on api, not telegram."""
    r = api.post("/api/v1/cron", json={"message": "x", "every_seconds": 60, "chanel": "telegram"})
    assert r.status_code == 422, r.text
    assert [(e["type"], e["loc"]) for e in r.json()["detail"]] == [("extra_forbidden", ["body", "chanel"])]
    assert api.get("/api/v1/cron").json() == []
    snake = api.post("/api/v1/cron", json={"message": "x", "every_seconds": 60, "missed_policy": "catch_up"})
    camel = api.post("/api/v1/cron", json={"message": "x", "everySeconds": 60, "missedPolicy": "catch_up"})
    assert snake.status_code == camel.status_code == 201, (snake.text, camel.text)
    jid = camel.json()["id"]
    r = api.patch(f"/api/v1/cron/{jid}", json={"enabeld": False})
    assert r.status_code == 422 and [e["loc"] for e in r.json()["detail"]] == [["body", "enabeld"]], r.text
    assert api.get(f"/api/v1/cron/{jid}").json()["enabled"] is True
    for change, now in (({"every_seconds": 90, "missed_policy": "skip"}, (90, "skip")),
                        ({"everySeconds": 120, "missedPolicy": "run_once"}, (120, "run_once"))):
        r = api.patch(f"/api/v1/cron/{jid}", json=change)
        assert r.status_code == 200 and (r.json()["everySeconds"], r.json()["missedPolicy"]) == now, r.text
