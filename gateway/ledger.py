"""Group commit for webhooks. The events of every request that arrives while a write is under way
wait for it to end, then go to the ledger together: one statement for them all (its own transaction:
one round trip, on the event loop). A lone webhook is written at once, so waiting adds nothing when
the gateway is idle, and under load each request pays a share of a write instead of its own.

A request is answered once its event is committed, as platforms send an unanswered event again; not
later, while the task is enqueued (the sweeper enqueues one that is lost: shared.channels.inbound).
One that goes away (or, for Discord, whose deadline passes) leaves its event in the batch: it is
recorded and its message submitted all the same.

The submissions are enqueued by a thread of their own, one Celery publish at a time (most of a
millisecond of Python each), while the next batches are written: the messages of every write that
ends meanwhile go in the next task together, so a busy gateway publishes less often than it writes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from shared.agent.runtime import Next
from shared.channels import inbound
from shared.channels.inbound import Entry
from shared.db import async_connect, unavailable
from shared.settings import Settings

log = logging.getLogger(__name__)
# Seconds between the end of an enqueue and the next: in a burst, the messages of a few more writes go
# in each task (8% more webhooks a second in bench item 1); a lone message is enqueued at once.
ENQUEUE_GAP = 0.004
Waiting = tuple[list[Entry], "asyncio.Future[list[bool]]"]


class Ledger:
    """One process's writer to the inbound ledger: one write in flight at a time, on one connection
    of its own, and one enqueue."""

    def __init__(self, settings: Settings, dispatch: Callable[[list[Next]], None]) -> None:
        self.url = settings.database_url
        self.grace = settings.runtime.lease_seconds  # a submission not done by then is enqueued again
        self.dispatch = dispatch
        self._waiting: list[Waiting] = []
        self._writer: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[tuple[Any, ...]] | None = None
        self._to_submit: list[int] = []  # committed, their submission not enqueued yet
        self._enqueuing: asyncio.Future[None] | None = None
        self._publisher = ThreadPoolExecutor(1, thread_name_prefix="ledger-enqueue")

    def record(self, entries: list[Entry]) -> asyncio.Future[list[bool]]:
        """Queue `entries` for the next write; the future tells, per entry, whether it is new (not a
        platform's retry), once committed."""
        done: asyncio.Future[list[bool]] = asyncio.get_running_loop().create_future()
        self._waiting.append((entries, done))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_all())
        return done

    async def drain(self, timeout: float) -> None:
        """At shutdown: wait up to `timeout` seconds for the writes queued or under way (events of
        requests answered at their deadline are among them) and for the enqueue of their submission,
        or they would be lost with the process (the sweeper enqueues a recorded one, later); then
        close the connection."""
        loop = asyncio.get_running_loop()
        if self._writer is not None or self._enqueuing is not None or self._to_submit:
            log.info("waiting for webhook events still to be recorded")
        try:
            async with asyncio.timeout(timeout):
                if self._writer is not None:
                    await asyncio.wait({self._writer})
                if self._enqueuing is not None:  # the last write's, maybe
                    await asyncio.wait({self._enqueuing})
                if self._to_submit:
                    ids, self._to_submit = self._to_submit, []
                    await loop.run_in_executor(self._publisher, self._send, ids)
        except TimeoutError:
            log.error("webhook events not recorded after %ss are lost with this process (the sweeper enqueues "
                      "those recorded)", timeout)
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _write_all(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                err = await self._write(batch)
                if err is None:
                    continue
                if len(batch) == 1 or unavailable(err):  # the database, not an event: each would wait for it again
                    self._fail(batch, err)
                    continue
                for one in batch:  # one bad event must not fail the others: each request's alone
                    if (alone := await self._write([one])) is not None:
                        self._fail([one], alone)
        finally:
            self._writer = None

    async def _write(self, batch: list[Waiting]) -> Exception | None:
        """Record the batch's events, tell their requests and enqueue their submission; what kept it
        from that, if anything."""
        entries = [e for waiting, _ in batch for e in waiting]
        try:
            recorded = await self._commit(entries)
        except Exception as err:
            return err
        self._tell(batch, recorded.new)
        self._enqueue(recorded.to_submit)
        return None

    async def _commit(self, entries: list[Entry]) -> inbound.Recorded:
        """One statement in autocommit. A connection that went stale while idle (the server
        restarted) is replaced and the statement sent again once: it is idempotent, and an event
        it finds recorded by the lost try is left for the sweeper to submit."""
        fresh = self._conn is None or self._conn.closed
        try:
            return await inbound.record(await self._connection(), entries, self.grace)
        except Exception as err:
            if not unavailable(err):
                raise
            await self._drop()
            if fresh:
                raise
        return await inbound.record(await self._connection(), entries, self.grace)

    async def _connection(self) -> psycopg.AsyncConnection[tuple[Any, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = await async_connect(self.url)
        return self._conn

    async def _drop(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    def _enqueue(self, event_ids: list[int]) -> None:
        """Enqueue the submission of `event_ids` with the others waiting, unless an enqueue is under
        way: they go in the next one, when it ends."""
        self._to_submit += event_ids
        if self._enqueuing is not None or not self._to_submit:
            return
        ids, self._to_submit = self._to_submit, []
        self._enqueuing = asyncio.get_running_loop().run_in_executor(self._publisher, self._send, ids)
        self._enqueuing.add_done_callback(self._sent)

    def _sent(self, _: asyncio.Future[None]) -> None:
        asyncio.get_running_loop().call_later(ENQUEUE_GAP, self._next_enqueue)

    def _next_enqueue(self) -> None:
        self._enqueuing = None
        self._enqueue([])

    def _send(self, event_ids: list[int]) -> None:
        try:
            self.dispatch(inbound.submission(event_ids))
        except Exception:  # recorded all the same: a failure here is no failure of the requests
            log.exception("could not enqueue the submission of %d message(s); the sweeper will", len(event_ids))

    @staticmethod
    def _tell(batch: list[Waiting], new: list[bool]) -> None:
        at = 0
        for waiting, done in batch:
            if not done.done():  # a request that went away cancelled its future
                done.set_result(new[at:at + len(waiting)])
            at += len(waiting)

    @staticmethod
    def _fail(batch: list[Waiting], err: Exception) -> None:
        """Tell the batch's requests that their events could not be recorded (they answer 503)."""
        events = sum(len(waiting) for waiting, _ in batch)
        log.error("could not record %d webhook event(s); their platform sends them again", events, exc_info=err)
        for _, done in batch:
            if not done.done():
                done.set_exception(err)
