"""Whether a tool call's run is still active, looked up while a long call works: `/stop`, a cancel
or the sweeper ends the run in Postgres, and a call that runs on (an exec command) should end too."""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import bindparam
from sqlmodel import col, select

from shared.db import get_engine, unavailable
from shared.models import ACTIVE, Run, RunStatus

log = logging.getLogger(__name__)
CHECK_INTERVAL = 1.0  # seconds between looks: a stopped command runs on at most about this long
RUN_STATUS = select(Run.status).where(col(Run.id) == bindparam("rid"))
# How a call's result tells what ended its run (a run deleted with its conversation has no row)
ENDED = {RunStatus.CANCELLED: "was cancelled", RunStatus.FAILED: "failed", RunStatus.SUCCEEDED: "ended",
         None: "was deleted"}


def run_status(database_url: str, run_id: str) -> RunStatus | None:
    """The run's status now, or None when it is gone: one primary-key lookup on a pooled connection,
    given back at once (a call may run for an hour; it holds no connection meanwhile)."""
    with get_engine(database_url).connect() as conn:
        status = conn.execute(RUN_STATUS, {"rid": run_id}).scalar_one_or_none()
    return None if status is None else RunStatus(status)


async def run_ended(database_url: str, run_id: str, interval: float = CHECK_INTERVAL) -> str:
    """Return, saying how (`ENDED`), once the run is no longer active; never while it is. A database
    that does not answer is logged and asked again next time: it must not stop the call."""
    failing = False
    while True:
        await asyncio.sleep(interval)
        try:
            status = await asyncio.to_thread(run_status, database_url, run_id)
        except Exception as err:  # whatever it was, the call goes on: it is only the watch that failed
            if not failing:
                log.warning("run %s: cannot look up whether the run is still active (the call goes on): %s%s",
                            run_id, err, "" if unavailable(err) else " (not a connection error)")
            failing = True
            continue
        if failing:
            log.info("run %s: its status can be looked up again", run_id)
            failing = False
        if status not in ACTIVE:
            return ENDED.get(status, f"ended ({status})")
