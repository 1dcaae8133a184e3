"""Run leases: a step holds its run's lease while it works; one thread per process renews them all."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import bindparam, func, text, update
from sqlmodel import Session

from shared.db import get_engine, table_of, update_returning
from shared.models import ACTIVE, Phase, Run, RunStatus

log = logging.getLogger(__name__)
RENEWED = "now() + make_interval(secs => cast(:s as double precision))"


def _until(seconds: float) -> object:
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
            lease_until=_until(seconds),
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
        self._held: dict[str, str | None] = {}  # run id -> owner (None: tool work, any owner)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def hold(self, run_id: str, owner: str | None = None) -> Iterator[None]:
        with self._lock:
            self._held[run_id] = owner
            self._start()
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(run_id, None)

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="nanofleet-lease", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._wake.wait(self.seconds / 3):
            with self._lock:
                held = dict(self._held)
            if held:
                try:
                    self.renew(held)
                except Exception as err:  # the sweeper takes over if renewals keep failing
                    log.warning("lease renewal failed: %s", err)

    def renew(self, held: dict[str, str | None]) -> None:
        owned = [rid for rid, owner in held.items() if owner is not None]
        shared_ = [rid for rid, owner in held.items() if owner is None]
        with get_engine(self.database_url).begin() as conn:
            if owned:
                conn.execute(
                    text(
                        f"update runs set lease_until = {RENEWED} where (id, lease_owner) in "
                        "(select * from unnest(cast(:ids as varchar[]), cast(:owners as varchar[])))"
                    ).bindparams(bindparam("ids"), bindparam("owners")),
                    {"s": self.seconds, "ids": owned, "owners": [held[r] for r in owned]},
                )
            if shared_:
                conn.execute(
                    text(f"update runs set lease_until = {RENEWED} where id = any(cast(:ids as varchar[])) "
                         "and phase = 'tools'"),
                    {"s": self.seconds, "ids": shared_},
                )


_keepers: dict[tuple[str, float], LeaseKeeper] = {}


def keeper(database_url: str, seconds: float) -> LeaseKeeper:
    """The process's keeper for this database."""
    key = (database_url, seconds)
    if key not in _keepers:
        _keepers[key] = LeaseKeeper(database_url, seconds)
    return _keepers[key]
