"""Schedule arithmetic for cron jobs, pure and timezone-correct.

Three kinds: `every` N seconds (anchored at the job's creation), `cron` (a 5-field expression read
as wall-clock time in an IANA timezone) and `at` (one instant). Every fire time is a whole second
in UTC, so a (job, fire time) pair is an exact key for receipts.

Cron across DST follows ISC cron. A job at fixed times (minute and hour fields without `*`) fires
once per matching wall time: one in a spring-forward gap fires at the instant the clocks jump
(02:30 runs at 03:00 new time), one that occurs twice in a fall-back fires at its first occurrence.
A wildcard job (minute or hour starting with `*`) follows the clock: it fires in both passes of a
repeated hour and not at all in a skipped one. croniter walks naive wall times (pure calendar
arithmetic, no DST in play); this module maps each to its instants.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

KINDS = ("every", "cron", "at")
POLICIES = ("skip", "run_once", "catch_up")
CATCH_UP_MAX = 10  # catch_up runs at most this many missed firings
GRACE = timedelta(minutes=5)  # a firing this late still counts as on time (policy skip)
LOOKBACK = timedelta(days=31)  # missed cron firings older than this are forgotten
MAX_STEPS = 10_000  # candidate wall times examined for one next fire time
MAX_EVERY = 10 * 366 * 86_400  # every_seconds at most ten years
FOLD_REACH = timedelta(hours=6)  # longer than any fall-back: where second passes may start
FIELDS = (("minute", "0-59"), ("hour", "0-23"), ("day of month", "1-31"), ("month", "1-12 or jan-dec"),
          ("weekday", "0-7 or sun-sat"))  # a cron line's fields, in order, with the values each takes


class ScheduleError(ValueError):
    """A schedule that cannot be used; the message says why."""


@dataclass(frozen=True)
class Spec:
    """What a job's schedule says, detached from the database row."""

    kind: str
    anchor: datetime  # creation time: `every` counts from here
    every_seconds: int | None = None
    cron_expr: str | None = None
    tz: str = "UTC"
    at: datetime | None = None


def whole_second(t: datetime) -> datetime:
    """`t` in UTC without its fraction of a second."""
    return t.astimezone(UTC).replace(microsecond=0)


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"unknown timezone '{name}' (use an IANA name such as Europe/Paris)") from None


def check_cron(expr: str) -> str:
    """The expression, normalised; raises ScheduleError unless it is a valid 5-field cron line,
    saying what is wrong: the number of fields, or which field and why."""
    fields = expr.split()
    expr = " ".join(fields)
    if len(fields) != len(FIELDS):
        raise ScheduleError(f"'{expr}' has {len(fields)} field{'' if len(fields) == 1 else 's'}; a cron expression "
                            "has 5: minute hour day month weekday")
    if not croniter.is_valid(expr):
        raise ScheduleError(f"'{expr}': {_bad_field(fields)}")
    return expr


def _bad_field(fields: list[str]) -> str:
    """Which field makes the expression invalid, tried alone (`*` in the others): croniter's own
    message quotes the whole line without naming the field."""
    for i, ((name, span), value) in enumerate(zip(FIELDS, fields, strict=True)):
        try:
            croniter.expand(" ".join(value if j == i else "*" for j in range(len(FIELDS))))
        except CroniterError as err:
            if any(words in str(err) for words in ("out of range", "out of bands")):
                return f"{name} '{value}' is out of range ({span})"
            return f"{name} '{value}' is not valid: use {span}, *, a range a-b, a list a,b or a step */n"
    return "not a valid cron expression (minute hour day month weekday)"


def validate(spec: Spec) -> None:
    """Raise ScheduleError when the spec is incomplete or invalid."""
    if spec.kind == "every":
        if not spec.every_seconds or not 1 <= spec.every_seconds <= MAX_EVERY:
            raise ScheduleError(f"every_seconds must be a whole number of seconds from 1 to {MAX_EVERY}")
    elif spec.kind == "cron":
        next_cron(spec.cron_expr or "", spec.tz, spec.anchor)  # raises unless it ever fires
    elif spec.kind == "at":
        if spec.at is None or spec.at.tzinfo is None:
            raise ScheduleError("at must be an ISO-8601 time with a timezone, e.g. 2030-01-01T09:00:00+01:00")
    else:
        raise ScheduleError(f"unknown schedule kind '{spec.kind}'; use one of {', '.join(KINDS)}")


def _jump(wall: datetime, tz: ZoneInfo, past_gap: datetime) -> datetime:
    """The instant the clocks jump over the gap `wall` falls in (fold=1 maps before it)."""
    lo = int(wall.replace(tzinfo=tz, fold=1).astimezone(UTC).timestamp())
    hi = int(past_gap.timestamp())
    offset_after = past_gap.astimezone(tz).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, UTC).astimezone(tz).utcoffset() == offset_after:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


def resolve(wall: datetime, tz: ZoneInfo) -> tuple[datetime, bool, datetime | None]:
    """A naive wall time as (first instant or the end of its gap, in a gap?, second instant if repeated)."""
    first = wall.replace(tzinfo=tz).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) != wall:
        return _jump(wall, tz, first), True, None
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    return first, False, second if second != first else None


def is_wildcard(expr: str) -> bool:
    minute, hour = expr.split()[:2]
    return minute.startswith("*") or hour.startswith("*")


def next_cron(expr: str, tz_name: str, after: datetime) -> datetime:
    """The first fire time of the cron expression strictly after `after`."""
    tz, expr = zone(tz_name), check_cron(expr)
    wildcard = is_wildcard(expr)
    start = after
    if wildcard and after.astimezone(tz).utcoffset() != (after + FOLD_REACH).astimezone(tz).utcoffset():
        start = after - FOLD_REACH  # a fall-back ahead: earlier wall times come round again
    walls = croniter(expr, start.astimezone(tz).replace(tzinfo=None))
    best: datetime | None = None
    for _ in range(MAX_STEPS):
        try:
            wall = walls.get_next(datetime)
        except CroniterError:  # e.g. "0 0 31 2 *": no such day
            break
        base, gap, second = resolve(wall, tz)
        if best is not None and base >= best:  # instants never decrease from here on
            return best
        candidates = ([] if gap and wildcard else [base]) + ([second] if second and wildcard else [])
        for c in candidates:
            if c > after and (best is None or c < best):
                best = c
    if best is not None:
        return best
    raise ScheduleError(f"'{expr}' has no fire time after {after.isoformat()}")


def next_after(spec: Spec, after: datetime) -> datetime | None:
    """The first fire time strictly after `after`; None when there is none (a past `at`)."""
    if spec.kind == "every":
        every = spec.every_seconds or 1
        anchor = whole_second(spec.anchor)
        k = max(0, int((after - anchor).total_seconds() // every)) + 1
        return anchor + timedelta(seconds=k * every)
    if spec.kind == "cron":
        return next_cron(spec.cron_expr or "", spec.tz, after)
    at = whole_second(spec.at) if spec.at else None
    return at if at is not None and at > after else None


def due(spec: Spec, after: datetime, until: datetime, limit: int = CATCH_UP_MAX) -> list[datetime]:
    """The last `limit` fire times in (after, until], oldest first."""
    if spec.kind == "every":
        return _due_every(spec, after, until, limit)
    span = timedelta(hours=1)  # look back only as far as it takes to find `limit` of them
    while True:
        start = max(after, until - span)
        found: deque[datetime] = deque(maxlen=limit)
        nxt = next_after(spec, start)
        while nxt is not None and nxt <= until:
            found.append(nxt)
            nxt = next_after(spec, nxt)
        if len(found) >= limit or start == after or span >= LOOKBACK:
            return list(found)
        span = min(span * 8, LOOKBACK)


def _due_every(spec: Spec, after: datetime, until: datetime, limit: int) -> list[datetime]:
    first = next_after(spec, after)
    if first is None or first > until:
        return []
    every = spec.every_seconds or 1
    anchor = whole_second(spec.anchor)
    k_first = int((first - anchor).total_seconds()) // every
    k_last = int((until - anchor).total_seconds() // every)
    return [anchor + timedelta(seconds=k * every) for k in range(max(k_first, k_last - limit + 1), k_last + 1)]


def pick(policy: str, times: list[datetime], now: datetime) -> list[datetime]:
    """Which of the due fire times to run now, under the job's missed-run policy.

    skip: only the latest, and only if it is on time (within GRACE); run_once: the latest, however
    late; catch_up: all of them (at most CATCH_UP_MAX), oldest first."""
    if not times:
        return []
    if policy == "catch_up":
        return times[-CATCH_UP_MAX:]
    if policy == "run_once" or now - times[-1] <= GRACE:
        return times[-1:]
    return []
