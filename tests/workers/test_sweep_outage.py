"""The sweeper while the database is down (in-process, the task's body run as a worker runs it):
beat sends it every second, and each raised, a traceback of 18 KB in the log each second."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from workers.tasks import scheduler


@pytest.mark.parametrize(("reason", "said"), [("connection refused\n\tIs the server running?", "connection refused"),
                                              ("", "OperationalError")], ids=["reason", "none"])
def test_a_database_outage_is_a_line_a_minute_and_its_end_one_more(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture, reason: str,
                                                                   said: str) -> None:
    down = OperationalError("select 1", {}, psycopg.OperationalError(reason))

    def failing(_rt: Any) -> Any:
        raise down

    monkeypatch.setattr(scheduler, "runtime", lambda: None)
    monkeypatch.setattr(scheduler, "dispatch", lambda nexts: None)
    monkeypatch.setattr(scheduler.recovery, "sweep", failing)
    scheduler._outage.clear()
    with caplog.at_level(logging.INFO, logger=scheduler.__name__):
        for _ in range(5):
            scheduler.sweep.run()  # raises nothing
        monkeypatch.setattr(scheduler.recovery, "sweep", lambda _rt: [])
        scheduler.sweep.run()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == scheduler.__name__]
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
    assert f"does not answer ({said})" in lines[0][1] and "answers again" in lines[1][1]
    assert all(r.exc_info is None for r in caplog.records)


def test_a_sweep_that_fails_otherwise_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong(_rt: Any) -> Any:
        raise ValueError("a bug")

    monkeypatch.setattr(scheduler, "runtime", lambda: None)
    monkeypatch.setattr(scheduler.recovery, "sweep", wrong)
    with pytest.raises(ValueError, match="a bug"):
        scheduler.sweep.run()
