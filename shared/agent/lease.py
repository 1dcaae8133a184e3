"""Run leases: a step holds its run's lease while it works; one thread per process renews them all.

A tools phase has no owner (its calls run side by side); the sweeper marks one whose lease ran out
while a call was running STALLED and gives it one more lease: a live worker late to renew (it
claimed the call as the lease ran out, or the database paused) renews it and clears the mark, and
only a call whose worker stayed silent that long too is taken for dead."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from sqlalchemy import bindparam, func, text, update
from sqlmodel import Session

from shared.db import get_engine, table_of, update_returning
from shared.models import ACTIVE, Phase, Run, RunStatus

log = logging.getLogger(__name__)
RENEWED = "now() + make_interval(secs => cast(:s as double precision))"
STALLED = "stalled"  # lease_owner of a tools phase found expired with a call running


class Held(NamedTuple):
    """A lease a step holds: an LLM step's (`owner`), or a tools step's (`step`, no owner)."""

    run_id: str
    owner: str | None
    step: int | None


def until(seconds: float) -> Any:
    """`seconds` from now on Postgres's clock, which the sweeper compares leases with."""
    return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def acquire(s: Session, *, run_id: str, seq: int, phase: Phase, owner: str, seconds: float) -> Run | None:
    """Take the lease for step `seq` unless a live holder has it; marks the run running and returns it."""
    runs = table_of(Run)
    statement = (
        update(runs)
        .where(
            runs.c.id == run_id,
            runs.c.step_seq == seq,
            runs.c.phase == phase.value,
            runs.c.status.in_([a.value for a in ACTIVE]),
            runs.c.lease_owner.is_(None) | (runs.c.lease_until < func.now()),
        )
        .values(
            lease_owner=owner,
            lease_until=until(seconds),
            status=RunStatus.RUNNING.value,
            started_at=func.coalesce(runs.c.started_at, func.now()),
        )
    )
    return update_returning(s, Run, statement)


class LeaseKeeper:
    """Renews every lease this process holds, in one statement, every third of the lease time."""

    def __init__(self, database_url: str, seconds: float) -> None:
        self.database_url = database_url
        self.seconds = seconds
        # What is held -> by how many steps: tool calls of one run may run side by side.
        self._held: Counter[Held] = Counter()
        self._lock = threading.Lock()
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

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="nanofleet-lease", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._wake.wait(self.seconds / 3):
            with self._lock:
                held = list(self._held)
            if held:
                try:
                    self.renew(held)
                except Exception as err:  # the sweeper takes over if renewals keep failing
                    log.warning("lease renewal failed: %s", err)

    def renew(self, held: list[Held]) -> None:
        owned = [h for h in held if h.owner is not None]
        tools = [h for h in held if h.owner is None]
        # A connection of its own: a process whose steps use every pooled one must still renew.
        with get_engine(self.database_url, pool_size=1).begin() as conn:
            if owned:
                conn.execute(
                    text(
                        f"update runs set lease_until = {RENEWED} where (id, lease_owner) in "
                        "(select * from unnest(cast(:ids as varchar[]), cast(:owners as varchar[])))"
                    ).bindparams(bindparam("ids"), bindparam("owners")),
                    {"s": self.seconds, "ids": [h.run_id for h in owned], "owners": [h.owner for h in owned]},
                )
            if tools:  # clears STALLED: the run's calls are alive (a late worker's call from an earlier step does not)
                conn.execute(
                    text(f"update runs set lease_until = {RENEWED}, lease_owner = null where (id, step_seq) in "
                         "(select * from unnest(cast(:ids as varchar[]), cast(:steps as integer[]))) "
                         "and phase = 'tools'"),
                    {"s": self.seconds, "ids": [h.run_id for h in tools], "steps": [h.step for h in tools]},
                )


_keepers: dict[tuple[str, float], LeaseKeeper] = {}


def keeper(database_url: str, seconds: float) -> LeaseKeeper:
    """The process's keeper for this database."""
    key = (database_url, seconds)
    if key not in _keepers:
        _keepers[key] = LeaseKeeper(database_url, seconds)
    return _keepers[key]
