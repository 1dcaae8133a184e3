"""Leases: a step holds its run's lease while it works, a compaction its conversation's, a worker
fetching a message's attachment ahead of its submission the message's ledger row; one thread per
process renews them all, so work whose worker died is taken up again within a lease.

A tools phase has no owner (its calls run side by side); the sweeper marks one whose lease ran out
while a call was running STALLED and gives it one more lease: a live worker late to renew (it
claimed the call as the lease ran out, or the database paused) renews it and clears the mark, and
only a call whose worker stayed silent that long too is taken for dead.

Lock order: runs first (several of them in id order), then conversations, then the rows under them
(tool calls, messages), as a step, cancellation, a deletion and the renewals here take them; so no
two transactions each hold a row the other waits for. (The sweeper takes runs with SKIP LOCKED: it
never waits for one.)"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Float, bindparam, func, text, update
from sqlmodel import Session, select

from shared.db import get_engine, returning_row, table_of, updated_row
from shared.models import ACTIVE, Phase, Run, RunStatus

log = logging.getLogger(__name__)
RENEWED = "now() + make_interval(secs => cast(:s as double precision))"
STALLED = "stalled"  # lease_owner of a tools phase found expired with a call running
# The runs whose leases a renewal holds, in id order (see the module's docstring)
RENEW_OWNED = text(
    f"update runs set lease_until = {RENEWED} where id in (select id from runs where (id, lease_owner) in "
    "(select * from unnest(cast(:ids as varchar[]), cast(:owners as varchar[]))) order by id for update)"
).bindparams(bindparam("ids"), bindparam("owners"))
# Clears STALLED: the run's calls are alive (a late worker's call from an earlier step does not)
RENEW_TOOLS = text(
    f"update runs set lease_until = {RENEWED}, lease_owner = null where id in (select id from runs "
    "where (id, step_seq) in (select * from unnest(cast(:ids as varchar[]), cast(:steps as integer[]))) "
    "and phase = 'tools' order by id for update)"
)
# A compaction's lease is its conversation's compacting_until: the value it last wrote is its token.
CLAIM = text(f"update conversations set compacting_until = {RENEWED} where id = :c "
             "and (compacting_until is null or compacting_until < now()) returning compacting_until")
RELEASE = text("update conversations set compacting_until = null where id = :c and compacting_until = :lease")
# Skips a conversation locked meanwhile (renewed next round): the keeper's thread renews runs too.
RENEW_COMPACTIONS = text(
    f"update conversations set compacting_until = {RENEWED} where id in (select id from conversations "
    "where (id, compacting_until) in (select * from unnest(cast(:ids as varchar[]), cast(:leases as timestamptz[]))) "
    "order by id for update skip locked) returning id, compacting_until"
)
# A fetch's lease is its ledger row's fetching_until (shared.channels.media), renewed only while the
# attachment is still to fetch: never over the result once written.
RENEW_FETCHES = text(
    f"update inbound_events set fetching_until = {RENEWED} where id in (select id from inbound_events "
    "where id = any(cast(:ids as bigint[])) and message->>'media' is not null order by id for update skip locked)"
)


class Held(NamedTuple):
    """A lease a step holds: an LLM step's (`owner`), or a tools step's (`step`, no owner)."""

    run_id: str
    owner: str | None
    step: int | None


def until(seconds: float | ColumnElement[float]) -> Any:
    """`seconds` from now on Postgres's clock, which the sweeper compares leases with."""
    return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def until_param(name: str) -> Any:
    """`until` for a statement built once: the seconds are its parameter `name`."""
    return until(bindparam(name, type_=Float))


def db_now(s: Session) -> datetime:
    """Postgres's clock: what leases and the sweeper's stamps are judged by, whatever this host's says."""
    now: datetime = s.execute(select(func.now())).scalar_one()
    return now


def live(s: Session, run: Run) -> bool:
    """Whether the run's lease (as the session read it) has not run out, on Postgres's clock."""
    return run.lease_until is not None and bool(s.execute(select(func.now() < run.lease_until)).scalar())


_RUNS = table_of(Run)
ACQUIRE = returning_row(Run, update(_RUNS).where(
    _RUNS.c.id == bindparam("rid"),
    _RUNS.c.step_seq == bindparam("seq"),
    _RUNS.c.phase == bindparam("in_phase"),
    _RUNS.c.status.in_([a.value for a in ACTIVE]),
    _RUNS.c.lease_owner.is_(None) | (_RUNS.c.lease_until < func.now()),
).values(
    lease_owner=bindparam("owner"),
    lease_until=until_param("lease"),
    status=RunStatus.RUNNING.value,
    started_at=func.coalesce(_RUNS.c.started_at, func.now()),
))


def acquire(s: Session, *, run_id: str, seq: int, phase: Phase, owner: str, seconds: float) -> Run | None:
    """Take the lease for step `seq` unless a live holder has it; marks the run running and returns it."""
    run: Run | None = updated_row(s, ACQUIRE, {"rid": run_id, "seq": seq, "in_phase": phase.value, "owner": owner,
                                               "lease": seconds})
    return run


class LeaseKeeper:
    """Renews every lease this process holds, every third of the lease time: the runs' in one
    statement (two, with tools phases), the compactions' in another, the fetches' in a third."""

    def __init__(self, database_url: str, seconds: float) -> None:
        self.database_url = database_url
        self.seconds = seconds
        # What is held -> by how many steps: tool calls of one run may run side by side.
        self._held: Counter[Held] = Counter()
        self._lock = threading.Lock()
        # Conversation -> its compaction lease as last written here; changed under _renewing only
        self._compactions: dict[str, datetime] = {}
        self._fetches: set[int] = set()  # ledger ids; changed under _renewing only
        self._renewing = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def hold(self, run_id: str, *, owner: str | None = None, step: int | None = None,
             taken: float | None = None) -> Iterator[None]:
        """Renew the lease while the block runs: the one `owner` took (an LLM step), or the run's
        while it is in tools step `step` (a tool call; whoever owns the run). `taken`: when
        (time.monotonic) the caller took the lease; if the work since took a third of it, it is
        renewed at once, not at the next round."""
        key = Held(run_id, owner, step)
        if taken is not None and time.monotonic() - taken > self.seconds / 3:
            try:
                self.renew([key])
            except Exception as err:  # the next round tries again; the sweeper takes over if they fail
                log.warning("lease renewal failed: %s", err)
        with self._lock:
            self._held[key] += 1
            self._start()
        try:
            yield
        finally:
            with self._lock:
                self._held[key] -= 1
                if not self._held[key]:
                    del self._held[key]

    @contextmanager
    def compacting(self, conversation_id: str) -> Iterator[bool]:
        """The conversation's compaction lease: yields whether this process took it (False while
        another compaction holds it); renewed while the block runs, freed after."""
        with get_engine(self.database_url).begin() as conn:
            taken: datetime | None = conn.execute(CLAIM, {"c": conversation_id, "s": self.seconds}).scalar()
        if taken is None:
            yield False
            return
        with self._renewing:
            self._compactions[conversation_id] = taken
        with self._lock:
            self._start()
        try:
            yield True
        finally:
            with self._renewing:  # not in the middle of a renewal: the lease as it stands now
                lease = self._compactions.pop(conversation_id)
            with get_engine(self.database_url).begin() as conn:
                conn.execute(RELEASE, {"c": conversation_id, "lease": lease})

    @contextmanager
    def fetching(self, event_id: int) -> Iterator[None]:
        """Renew the fetch lease this process took on ledger event `event_id` while the block runs;
        once it has ended no renewal touches the row, so what the caller writes to it next stands."""
        with self._renewing:
            self._fetches.add(event_id)
        with self._lock:
            self._start()
        try:
            yield
        finally:
            with self._renewing:
                self._fetches.discard(event_id)

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="nanofleet-lease", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._wake.wait(self.seconds / 3):
            with self._lock:
                held = list(self._held)
            if held:
                _attempt(self.renew, held)
            _attempt(self.renew_compactions)
            _attempt(self.renew_fetches)

    def renew(self, held: list[Held]) -> None:
        """Renew the runs' leases; each statement in a transaction of its own, taking runs in id order."""
        owned = [h for h in held if h.owner is not None]
        tools = [h for h in held if h.owner is None]
        # A connection of its own: a process whose steps use every pooled one must still renew.
        engine = get_engine(self.database_url, pool_size=1)
        if owned:
            with engine.begin() as conn:
                conn.execute(RENEW_OWNED, {"s": self.seconds, "ids": [h.run_id for h in owned],
                                           "owners": [h.owner for h in owned]})
        if tools:
            with engine.begin() as conn:
                conn.execute(RENEW_TOOLS, {"s": self.seconds, "ids": [h.run_id for h in tools],
                                           "steps": [h.step for h in tools]})

    def renew_compactions(self) -> None:
        """Renew the compaction leases this process holds, noting each one's new value (its token)."""
        with self._renewing:
            if not self._compactions:
                return
            params = {"s": self.seconds, "ids": list(self._compactions), "leases": list(self._compactions.values())}
            with get_engine(self.database_url, pool_size=1).begin() as conn:
                renewed = conn.execute(RENEW_COMPACTIONS, params).all()
            self._compactions.update({cid: until for cid, until in renewed})


    def renew_fetches(self) -> None:
        with self._renewing:
            if self._fetches:
                with get_engine(self.database_url, pool_size=1).begin() as conn:
                    conn.execute(RENEW_FETCHES, {"s": self.seconds, "ids": sorted(self._fetches)})


def _attempt(renewal: Callable[..., None], *args: Any) -> None:
    try:
        renewal(*args)
    except Exception as err:  # the next round tries again; once the lease ran out, others take over
        log.warning("lease renewal failed: %s", err)


_keepers: dict[tuple[str, float], LeaseKeeper] = {}


def keeper(database_url: str, seconds: float) -> LeaseKeeper:
    """The process's keeper for this database."""
    key = (database_url, seconds)
    if key not in _keepers:
        _keepers[key] = LeaseKeeper(database_url, seconds)
    return _keepers[key]
