"""Cron end to end: the REST API, real worker and beat processes, fake LLM (restarts: test_restarts.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

from sqlmodel import col, select

from shared.constants import T_CRON_FIRE
from shared.models import TERMINAL, Outbox, Run, RunKind, utcnow
from shared.queueing import Producer, make_celery
from shared.scheduling.beat import BeatMirror, beat_app
from tests.support.processes import wait_until
from tests.support.scheduling import (
    TELEGRAM,
    call,
    client,
    db,
    job,
    new_conversation,
    receipts,
    runs,
    scheduling_stack,
)
from tests.support.stack import Stack


def cron_runs(stack: Stack, job_id: str) -> list[Run]:
    ids = {r.run_id for r in receipts(stack, job_id)}
    return [r for r in runs(stack, kind=RunKind.CRON) if r.id in ids]


def tags(stack: Stack) -> list[str]:
    return [line.split()[-1] for line in stack.executions()]


def test_every_job_fires_repeatedly_and_stops_when_removed(make_stack: Callable[..., Stack]) -> None:
    stack = scheduling_stack(make_stack, beat=True, **TELEGRAM)
    with client(stack) as api:
        r = api.post("/api/v1/cron", json={"message": call("record", tag="tick"), "everySeconds": 1,
                                           "channel": "telegram", "chatId": "42"})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        wait_until(lambda: tags(stack).count("tick") >= 3, timeout=60, message="three firings")
        assert api.delete(f"/api/v1/cron/{jid}").status_code == 204
        fired = len(receipts(stack, jid))
        other = api.post("/api/v1/cron", json={"message": call("record", tag="other"), "everySeconds": 1}).json()
        wait_until(lambda: tags(stack).count("other") >= 2, timeout=60, message="the other job to fire twice")
    assert len(receipts(stack, jid)) == fired  # nothing fired after the removal
    assert BeatMirror(beat_app(stack.settings)).armed(jid) is None
    wait_until(lambda: all(r.status in TERMINAL for r in runs(stack)), message="runs to end")
    done = [r for r in runs(stack, kind=RunKind.CRON) if r.origin.get("cron_job_id") == jid]
    assert len(done) == fired == tags(stack).count("tick")  # one run, and one tool execution, per firing
    with db(stack) as s:
        sent = s.exec(select(Outbox).where(Outbox.channel == "telegram", Outbox.chat_id == "42")).all()
    assert sorted(o.content for o in sent) == sorted(r.final_text or "" for r in done)
    assert {o.run_id or o.key.split(":")[0] for o in sent} == {r.id for r in done}
    assert other["id"] != jid


def test_duplicate_fires_of_one_time_run_once(sched: Stack) -> None:
    stack = sched
    with client(stack) as api:
        jid = api.post("/api/v1/cron", json={"message": call("record", tag="dup"), "everySeconds": 3600}).json()["id"]
        due = api.get(f"/api/v1/cron/{jid}").json()["nextRunAt"]
    producer, worker = Producer(make_celery(stack.settings)), stack.procs[-1]
    handled = worker.log().count(f"{T_CRON_FIRE}[")
    for _ in range(6):  # as if two beats and a replay all sent the same firing
        producer.send(T_CRON_FIRE, jid, due)
    wait_until(lambda: worker.log().count(f"{T_CRON_FIRE}[") >= handled + 12, message="every fire task to be handled")
    wait_until(lambda: tags(stack) == ["dup"] and all(r.status in TERMINAL for r in cron_runs(stack, jid)),
               message="the firing's run")
    [rec] = receipts(stack, jid)
    assert rec.scheduled_for.isoformat() == due and len(cron_runs(stack, jid)) == 1


def test_cron_tool_in_a_turn(sched: Stack) -> None:
    stack = sched
    mirror = BeatMirror(beat_app(stack.settings))
    with client(stack) as api:
        cid = api.post("/api/v1/conversations").json()["conversationId"]

        def tool(**args: object) -> dict[str, object]:
            body = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": call("cron", **args)}).json()
            [c] = body["toolCalls"]
            return dict(c)

        added = tool(action="add", message="water the plants", cron_expr="0 9 * * *", tz="Europe/Paris")
        assert added["status"] == "SUCCESS", added
        jid = str(added["result"]).split('"job_id": "')[1].split('"')[0]
        assert (j := job(stack, jid)) is not None and (j.channel, j.chat_id) == ("api", cid)
        assert mirror.armed(jid) is not None
        assert jid in str(tool(action="list")["result"])
        assert tool(action="disable", job_id=jid)["status"] == "SUCCESS"
        assert mirror.armed(jid) is None and not job(stack, jid).enabled  # type: ignore[union-attr]
        assert tool(action="enable", job_id=jid)["status"] == "SUCCESS"
        assert mirror.armed(jid) is not None
        bad = tool(action="add", message="x", every_seconds=5, cron_expr="* * * * *")
        assert bad["status"] == "FAILED" and "exactly one" in str(bad["result"])
        assert tool(action="remove", job_id=jid)["status"] == "SUCCESS"
        assert job(stack, jid) is None and mirror.armed(jid) is None
        with db(stack) as s:
            assert s.exec(select(Outbox).where(col(Outbox.channel) != "api")).first() is None


def test_a_reminder_set_in_an_api_chat_comes_back_to_it(sched: Stack) -> None:
    """The job's run is in its own session; its answer is posted to the chat that asked, once."""
    stack = sched
    with client(stack) as api:
        cid = new_conversation(api)
        at = (utcnow() + timedelta(seconds=30)).isoformat()
        add = call("cron", action="add", message="remind me: drink water", at=at)
        [added] = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": add}).json()["toolCalls"]
        jid = json.loads(added["result"])["job_id"]
        due = api.get(f"/api/v1/cron/{jid}").json()["nextRunAt"]
        producer = Producer(make_celery(stack.settings))
        for _ in range(2):  # beat, at its time, and a duplicate
            producer.send(T_CRON_FIRE, jid, due)

        def reminders() -> list[str]:
            done = [r.final_text for r in cron_runs(stack, jid) if r.status in TERMINAL]
            shown = api.get(f"/api/v1/conversations/{cid}/messages").json()
            return [m["content"] for m in shown if m["role"] == "ASSISTANT" and m["content"] in done]

        wait_until(reminders, message="the reminder in the chat")
        [run] = cron_runs(stack, jid)
        assert reminders() == [run.final_text] and "remind me: drink water" in (run.final_text or "")
        assert run.conversation_id != cid
