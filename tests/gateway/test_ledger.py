"""The gateway's group commit (gateway/ledger.py) on real Postgres: requests that arrive during a
write share the next one, and one event that cannot be written fails its own request only."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from sqlalchemy import text

from gateway.ledger import Ledger
from shared.agent.runtime import Next
from shared.channels.inbound import Entry, Recorded
from shared.constants import T_INGEST
from shared.contracts import InboundMessage
from shared.db import get_engine, unavailable
from tests.fakes.server import free_port
from tests.support.stack import Stack


def _entry(event: str) -> Entry:
    return Entry(InboundMessage(channel="telegram", chat_id=event, sender_id="7", content="hi", event_id=event), True)


def test_a_burst_shares_writes_and_a_bad_event_fails_its_own_request_only(
        make_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_stack().settings
    sent: list[list[Next]] = []
    ledger = Ledger(settings, sent.append)
    commit = ledger._commit
    writes: list[list[str]] = []

    async def failing_on_poison(entries: list[Entry]) -> Recorded:
        writes.append([e.message.event_id for e in entries])
        if any(e.message.event_id == "poison" for e in entries):
            raise RuntimeError("this event cannot be stored")
        return await commit(entries)

    monkeypatch.setattr(ledger, "_commit", failing_on_poison)

    async def burst() -> list[object]:  # five requests at once: one write for them all
        answers: list[object] = await asyncio.gather(
            *(ledger.record([_entry(e)]) for e in ("e0", "e1", "poison", "e2", "e1")), return_exceptions=True)
        await ledger.drain(timeout=30)
        return answers

    results = asyncio.run(burst())
    assert results[:2] == [[True], [True]] and isinstance(results[2], RuntimeError)
    assert results[3:] == [[True], [False]]  # the second "e1" is a platform's retry
    # all five together, which failed; then each request alone
    assert writes == [["e0", "e1", "poison", "e2", "e1"], ["e0"], ["e1"], ["poison"], ["e2"], ["e1"]]
    with get_engine(settings.database_url).connect() as conn:
        stored = conn.execute(text("select id, event_id from inbound_events order by id")).all()
    assert [e for _, e in stored] == ["e0", "e1", "e2"]
    # each message's submission enqueued once, in order: the writes that end during an enqueue share the next
    assert all(n.task == T_INGEST for nexts in sent for n in nexts)
    assert [i for nexts in sent for n in nexts for i in n.args[0]] == [i for i, _ in stored]


def test_a_connection_the_server_dropped_is_replaced_without_failing_a_request(
        make_stack: Callable[..., Stack]) -> None:
    """The writer keeps one connection; when the server ends it (a restart, an idle timeout), the
    next write finds it dead, connects again and sends its statement again, and its requests get
    their answer, not a 503."""
    settings = make_stack().settings
    ledger = Ledger(settings, lambda nexts: None)
    engine = get_engine(settings.database_url)

    async def twice() -> list[list[bool]]:
        first = await ledger.record([_entry("before")])
        assert ledger._conn is not None
        with engine.begin() as conn:  # as a server restart does to every connection
            ended = conn.execute(text("select pg_terminate_backend(:pid)"), {"pid": ledger._conn.info.backend_pid})
            assert ended.scalar() is True
        second = await ledger.record([_entry("after"), _entry("before")])
        await ledger.drain(timeout=30)
        return [first, second]

    assert asyncio.run(twice()) == [[True], [True, False]]
    with engine.connect() as conn:
        assert conn.execute(text("select event_id from inbound_events order by id")).scalars().all() == \
            ["before", "after"]


def test_a_burst_the_database_cannot_take_fails_in_one_write(make_stack: Callable[..., Stack],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """While the database does not answer, a failed batch was written again request by request: each
    waits for the connect timeout (10 s), so a burst of N was answered after N + 1 of them, and the
    requests behind it waited too (helper's review)."""
    settings = make_stack().settings
    down = settings.model_copy(update={"database_url": f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/none"})
    ledger = Ledger(down, lambda nexts: None)
    commit = ledger._commit
    writes: list[int] = []

    async def counted(entries: list[Entry]) -> Recorded:
        writes.append(len(entries))
        return await commit(entries)

    monkeypatch.setattr(ledger, "_commit", counted)

    async def burst() -> list[object]:
        return await asyncio.gather(*(ledger.record([_entry(f"e{i}")]) for i in range(5)), return_exceptions=True)

    results = asyncio.run(burst())
    assert writes == [5]
    assert all(isinstance(r, Exception) and unavailable(r) for r in results), results


def test_requests_are_answered_once_recorded_while_their_submission_is_enqueued(
        make_stack: Callable[..., Stack]) -> None:
    """The answer waits for the commit, not for the broker: a publish that takes its time (a slow or
    reconnecting Redis) delays no platform's 200, and the submission is enqueued all the same."""
    settings = make_stack().settings
    enqueuing, release = threading.Event(), threading.Event()
    sent: list[list[Next]] = []

    def slow_dispatch(nexts: list[Next]) -> None:
        enqueuing.set()
        assert release.wait(30), "the test never released the broker"
        sent.append(nexts)

    ledger = Ledger(settings, slow_dispatch)

    async def record_while_enqueuing() -> list[bool]:
        written = ledger.record([_entry("slow-broker")])
        new = await asyncio.wait_for(written, 10)  # answered while the dispatch waits (before: a timeout)
        assert not sent and await asyncio.to_thread(enqueuing.wait, 30)
        release.set()
        await ledger.drain(timeout=30)
        return new

    assert asyncio.run(record_while_enqueuing()) == [True]
    with get_engine(settings.database_url).connect() as conn:
        event = conn.execute(text("select id from inbound_events where event_id = 'slow-broker'")).scalar()
    assert [[n.args for n in nexts] for nexts in sent] == [[([event],)]]
