"""Schedule arithmetic: cron in IANA timezones across DST (examples and a brute-force property),
`every` anchoring, `at`, and the missed-run policies."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.scheduling import schedules
from shared.scheduling.schedules import GRACE, ScheduleError, Spec, due, is_wildcard, next_after, next_cron, pick

MINUTE = timedelta(minutes=1)
ZERO = timedelta(0)
ZONES = ["Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Australia/Sydney", "America/Santiago",
         "Pacific/Chatham", "Europe/London", "Asia/Kolkata", "UTC"]
MINUTES = ["*", "*/15", "*/20", "0", "30", "5,35", "0-10", "59", "*/7"]
HOURS = ["*", "*/6", "2", "1-3", "9", "0,12", "3", "1", "23"]
WEEKDAYS = ["*", "0", "1-5", "6"]


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def chain(expr: str, tz: str, start: datetime, n: int) -> list[str]:
    out, t = [], start
    for _ in range(n):
        t = next_cron(expr, tz, t)
        out.append(t.astimezone(ZoneInfo(tz)).isoformat())
    return out


def test_daily_job_keeps_its_wall_time_across_dst() -> None:
    assert chain("0 9 * * *", "Europe/Paris", utc(2024, 3, 29), 3) == [
        "2024-03-29T09:00:00+01:00", "2024-03-30T09:00:00+01:00", "2024-03-31T09:00:00+02:00"]
    assert chain("0 9 * * *", "America/New_York", utc(2024, 11, 2), 2) == [
        "2024-11-02T09:00:00-04:00", "2024-11-03T09:00:00-05:00"]


def test_a_time_in_the_spring_gap_runs_when_the_clocks_jump() -> None:
    assert chain("30 2 * * *", "Europe/Paris", utc(2024, 3, 30, 12), 2) == [
        "2024-03-31T03:00:00+02:00", "2024-04-01T02:30:00+02:00"]
    assert chain("0 2 * * *", "America/New_York", utc(2024, 3, 9, 12), 1) == ["2024-03-10T03:00:00-04:00"]


def test_a_repeated_time_runs_once_but_wildcard_jobs_follow_the_clock() -> None:
    assert chain("30 2 * * *", "Europe/Paris", utc(2024, 10, 26, 12), 2) == [
        "2024-10-27T02:30:00+02:00", "2024-10-28T02:30:00+01:00"]
    assert chain("0 * * * *", "Europe/Paris", utc(2024, 10, 26, 22, 30), 4) == [
        "2024-10-27T01:00:00+02:00", "2024-10-27T02:00:00+02:00", "2024-10-27T02:00:00+01:00",
        "2024-10-27T03:00:00+01:00"]
    assert chain("*/30 * * * *", "Europe/Paris", utc(2024, 3, 31, 0, 15), 3) == [
        "2024-03-31T01:30:00+01:00", "2024-03-31T03:00:00+02:00", "2024-03-31T03:30:00+02:00"]


def test_invalid_cron_and_timezone_are_refused() -> None:
    for expr in ("61 * * * *", "* * * *", "0 0 9 * * *", "every day"):
        with pytest.raises(ScheduleError):
            next_cron(expr, "UTC", utc(2024, 1, 1))
    with pytest.raises(ScheduleError, match="unknown timezone"):
        next_cron("0 9 * * *", "Mars/Olympus", utc(2024, 1, 1))


def test_an_invalid_cron_line_is_refused_with_what_is_wrong() -> None:
    cases = {
        "61 * * * *": "minute '61' is out of range (0-59)",
        "0 24 * * *": "hour '24' is out of range (0-23)",
        "0 9 0 * *": "day of month '0' is out of range (1-31)",
        "0 9 * 13 *": "month '13' is out of range (1-12 or jan-dec)",
        "0 9 * * 1-9": "weekday '1-9' is out of range (0-7 or sun-sat)",
        "0 nine * * *": "hour 'nine' is not valid",
        "*/0 * * * *": "minute '*/0' is not valid",
        "* * * *": "'* * * *' has 4 fields; a cron expression has 5: minute hour day month weekday",
        "0 0 9 * * *": "has 6 fields",
        "@daily": "has 1 field;",
    }
    for expr, reason in cases.items():
        with pytest.raises(ScheduleError) as refused:
            schedules.check_cron(expr)
        assert reason in str(refused.value), (expr, str(refused.value))


@given(field=st.integers(0, 4), value=st.integers(0, 999))
def test_an_out_of_range_value_names_its_field(field: int, value: int) -> None:
    name, span, low, high = [("minute", "0-59", 0, 59), ("hour", "0-23", 0, 23), ("day of month", "1-31", 1, 31),
                             ("month", "1-12 or jan-dec", 1, 12), ("weekday", "0-7 or sun-sat", 0, 7)][field]
    expr = " ".join(str(value) if i == field else "*" for i in range(5))
    if low <= value <= high:
        assert schedules.check_cron(expr) == expr
    else:
        with pytest.raises(ScheduleError) as refused:
            schedules.check_cron(expr)
        assert str(refused.value) == f"'{expr}': {name} '{value}' is out of range ({span})"


# --------------------------------------------------------------------------- the property


def _field(spec: str, lo: int, hi: int) -> set[int]:
    values: set[int] = set()
    for part in spec.split(","):
        base, _, step = part.partition("/")
        first, last = (lo, hi) if base == "*" else (int(base.split("-")[0]), int(base.split("-")[-1]))
        values |= set(range(first, last + 1, int(step or 1)))
    return values


def _matcher(expr: str) -> Callable[[datetime], bool]:
    minute, hour, _, _, dow = expr.split()
    minutes, hours, days = _field(minute, 0, 59), _field(hour, 0, 23), _field(dow, 0, 6)
    return lambda w: w.minute in minutes and w.hour in hours and (w.weekday() + 1) % 7 in days


def reference_next(expr: str, tz: str, after: datetime) -> datetime:
    """Minute by minute in UTC: wall times that match (first pass only, unless wildcard), and for
    fixed-time jobs the instant the clocks jump over a gap holding a match."""
    zone, match, wildcard = ZoneInfo(tz), _matcher(expr), is_wildcard(expr)
    m = after.replace(second=0, microsecond=0) + MINUTE
    before = (m - MINUTE).astimezone(zone)
    for _ in range(60 * 24 * 9):
        local = m.astimezone(zone)
        if not wildcard and (local.utcoffset() or ZERO) > (before.utcoffset() or ZERO):
            wall, end = before.replace(tzinfo=None) + MINUTE, local.replace(tzinfo=None)
            while wall < end:
                if match(wall):
                    return m
                wall += MINUTE
        if match(local) and (wildcard or local.fold == 0):
            return m
        before, m = local, m + MINUTE
    raise AssertionError("no reference fire time within 9 days")


def _transitions() -> list[tuple[str, datetime]]:
    found = []
    for tz in ZONES:
        zone, t = ZoneInfo(tz), utc(2024, 1, 1)
        while t < utc(2025, 1, 1):
            if (t + timedelta(hours=1)).astimezone(zone).utcoffset() != t.astimezone(zone).utcoffset():
                found.append((tz, t))
            t += timedelta(hours=1)
    return found


TRANSITIONS = _transitions()


@settings(max_examples=150, deadline=None)
@given(
    minute=st.sampled_from(MINUTES), hour=st.sampled_from(HOURS), dow=st.sampled_from(WEEKDAYS),
    near=st.sampled_from(TRANSITIONS), shift=st.integers(-36 * 3600, 36 * 3600),
)
def test_next_fire_time_matches_a_brute_force_reference(minute: str, hour: str, dow: str,
                                                        near: tuple[str, datetime], shift: int) -> None:
    expr, (tz, transition) = f"{minute} {hour} * * {dow}", near
    after = transition + timedelta(seconds=shift)
    first = next_cron(expr, tz, after)
    assert first == reference_next(expr, tz, after)
    second = next_cron(expr, tz, first)
    assert second == reference_next(expr, tz, first) and second > first
    assert first.second == 0 and first.tzinfo is not None


@settings(max_examples=100, deadline=None)
@given(anchor=st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1), timezones=st.just(UTC)),
       every=st.integers(1, 100_000), later=st.integers(-10**6, 10**7))
def test_every_counts_whole_periods_from_the_anchor(anchor: datetime, every: int, later: int) -> None:
    spec = Spec(kind="every", anchor=anchor, every_seconds=every)
    after = anchor + timedelta(seconds=later)
    nxt = next_after(spec, after)
    start = schedules.whole_second(anchor)
    assert nxt is not None and nxt > after and (nxt - start).total_seconds() % every == 0
    if after >= anchor:
        assert nxt - after <= timedelta(seconds=every)
    else:
        assert nxt == start + timedelta(seconds=every)  # the first run is one period after creation


def test_due_keeps_the_latest_fire_times_oldest_first() -> None:
    spec = Spec(kind="every", anchor=utc(2024, 1, 1), every_seconds=60)
    times = due(spec, utc(2024, 1, 1), utc(2024, 1, 1, 1), limit=3)
    assert times == [utc(2024, 1, 1, 0, 58), utc(2024, 1, 1, 0, 59), utc(2024, 1, 1, 1)]
    cron = Spec(kind="cron", anchor=utc(2024, 1, 1), cron_expr="0 9 * * *", tz="Europe/Paris")
    assert due(cron, utc(2024, 1, 1), utc(2024, 1, 4, 12)) == [utc(2024, 1, 1, 8), utc(2024, 1, 2, 8),
                                                                 utc(2024, 1, 3, 8), utc(2024, 1, 4, 8)]
    at = Spec(kind="at", anchor=utc(2024, 1, 1), at=utc(2024, 1, 2))
    assert due(at, utc(2024, 1, 1), utc(2024, 1, 3)) == [utc(2024, 1, 2)]
    assert next_after(at, utc(2024, 1, 2)) is None


def test_missed_policies() -> None:
    now = utc(2024, 1, 10, 12)
    times = [utc(2024, 1, d, 9) for d in range(1, 11)]
    assert pick("skip", times, now) == []  # three hours late: skipped
    assert pick("skip", times, times[-1] + GRACE) == times[-1:]  # late by the grace: still on time
    assert pick("run_once", times, now) == times[-1:]
    more = [*times, utc(2024, 1, 10, 10)]
    assert pick("catch_up", more, now) == more[-10:]
    assert pick("skip", [], now) == []


def test_a_one_shot_job_that_is_late_shows_when_it_was_due_until_it_has_fired() -> None:
    """`nextRunAt` was null for an `at` job whose time passed with no worker up, though it still runs
    (run_once): null reads as "never"."""
    from shared.models import CronJob
    from shared.scheduling.jobs import view

    made, at = datetime(2026, 11, 29, 21, 41, 0, tzinfo=UTC), datetime(2026, 11, 29, 21, 41, 30, tzinfo=UTC)
    job = CronJob(name="x", message="m", kind="at", at=at, created_at=made, missed_policy="run_once")
    assert view(job, now=at + timedelta(seconds=8))["nextRunAt"] == at.isoformat()
    assert view(job, now=at - timedelta(seconds=8))["nextRunAt"] == at.isoformat()
    job.last_fired_at = at  # fired (the job is removed then; a disabled one shows none either)
    assert view(job, now=at + timedelta(seconds=8))["nextRunAt"] is None
    job.last_fired_at, job.enabled = None, False
    assert view(job, now=at + timedelta(seconds=8))["nextRunAt"] is None
