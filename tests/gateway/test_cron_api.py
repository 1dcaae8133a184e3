"""`/api/v1/cron`: create, list, show, change and delete jobs; the beat mirror follows each change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from fastapi.testclient import TestClient

from shared.scheduling.beat import BeatMirror, beat_app
from tests.support.stack import Stack


def mirror(stack: Stack) -> BeatMirror:
    return BeatMirror(beat_app(stack.settings))


def test_create_list_change_delete(stack: Stack, api: Any) -> None:
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
        ({"message": "x", "cronExpr": "61 * * * *"}, "5-field"),
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


def test_cron_needs_an_api_key(stack: Stack) -> None:
    from gateway.app import create_app

    with TestClient(create_app(stack.settings)) as anonymous:
        assert anonymous.get("/api/v1/cron").status_code == 401
        assert anonymous.post("/api/v1/cron", json={"message": "x", "everySeconds": 5}).status_code == 401
