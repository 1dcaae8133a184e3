"""Group commit for webhooks. The events of every request that arrives while a write is under way
wait for it to end, then go to the ledger together: one statement (its own transaction: one round
trip) and one enqueued task for them all. A lone webhook is written at once, so waiting adds nothing
when the gateway is idle, and under load each request pays a share of a write instead of its own (a
commit is a round trip, and a Celery publish is most of a millisecond of Python).

A request is answered once its event is committed, as platforms send an unanswered event again; not
later, while the task is enqueued (the sweeper enqueues one that is lost: shared.channels.inbound).
One that goes away (or, for Discord, whose deadline passes) leaves its event in the batch: it is
recorded and its message submitted all the same."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import anyio.to_thread

from shared.agent.runtime import Next
from shared.channels import inbound
from shared.channels.inbound import Entry
from shared.db import get_engine, unavailable
from shared.settings import Settings

log = logging.getLogger(__name__)
Waiting = tuple[list[Entry], "asyncio.Future[list[bool]]"]


class Ledger:
    """One process's writer to the inbound ledger: one write in flight at a time."""

    def __init__(self, settings: Settings, dispatch: Callable[[list[Next]], None]) -> None:
        self.url = settings.database_url
        self.grace = settings.runtime.lease_seconds  # a submission not done by then is enqueued again
        self.dispatch = dispatch
        self._waiting: list[Waiting] = []
        self._writer: asyncio.Task[None] | None = None

    def record(self, entries: list[Entry]) -> asyncio.Future[list[bool]]:
        """Queue `entries` for the next write; the future tells, per entry, whether it is new (not a
        platform's retry), once committed and its submission enqueued."""
        done: asyncio.Future[list[bool]] = asyncio.get_running_loop().create_future()
        self._waiting.append((entries, done))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_all())
        return done

    async def drain(self, timeout: float) -> None:
        """At shutdown: wait up to `timeout` seconds for the writes queued or under way (events of
        requests answered at their deadline are among them), or they would be lost with the process."""
        if self._writer is not None:
            log.info("waiting for webhook events still to be recorded")
            _, late = await asyncio.wait({self._writer}, timeout=timeout)
            if late:
                log.error("webhook events still not recorded after %ss are lost with this process", timeout)

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
        """Record the batch's events and tell their requests; what kept it from that, if anything."""
        entries = [e for waiting, _ in batch for e in waiting]
        loop = asyncio.get_running_loop()

        def tell(new: list[bool]) -> None:  # from the writer's thread
            loop.call_soon_threadsafe(self._tell, batch, new)

        try:
            await anyio.to_thread.run_sync(self._commit, entries, tell)
        except Exception as err:
            return err
        return None

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

    def _commit(self, entries: list[Entry], tell: Callable[[list[bool]], object]) -> None:
        """Record `entries` and enqueue the submission of the new messages. The requests are told once
        the events are committed, while the task is enqueued: the sweeper enqueues it if it is lost."""
        # One statement: in autocommit it is its own transaction, one round trip (BEGIN and COMMIT were two more)
        with get_engine(self.url).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            recorded = inbound.record(conn, entries, self.grace)
        tell(recorded.new)
        try:
            self.dispatch(inbound.submission(recorded.to_submit))
        except Exception:  # recorded all the same: a failure here is no failure of the requests
            log.exception("could not enqueue the submission of %d message(s); the sweeper will",
                          len(recorded.to_submit))
