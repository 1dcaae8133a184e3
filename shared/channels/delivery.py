"""Outbound delivery of outbox rows: claim, shared rate limits, send, mark delivered; retries with
backoff, dead letters, in-order chunks, redelivery of rows whose task was lost.

A row is claimed by a conditional UPDATE that pushes its next_attempt_at past the send (no other
worker may take it until then), sent, and marked delivered with its platform message id in one
UPDATE. Chunks of one reply go out in order: a chunk waits while the one before it is pending (and
is dead-lettered if that one failed), and delivering chunk i enqueues chunk i+1. A platform's 429
is waited out without counting an attempt, up to THROTTLES_PER_ATTEMPT times MAX_ATTEMPTS throttles.

The only window that can duplicate a message is a worker dying between the platform's 200 and the
mark-delivered UPDATE, or a send that timed out after the platform had accepted it; see
docs/channels.md. A database that fails at that moment does not duplicate: the mark is retried
while the claim lasts, and if it still fails a marker in Redis tells the next claimant the row went
out.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from redis import ConnectionError as RedisConnectionError
from redis import RedisError
from redis import TimeoutError as RedisTimeoutError
from sqlalchemy import func, text, type_coerce, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Session, col, select
from tenacity import Retrying, retry_if_exception, stop_before_delay, wait_exponential

from shared.agent.runtime import Next, Runtime
from shared.channels import REGISTRY
from shared.channels.base import Channel, OutFile, RateLimited, Rejected, SendResult
from shared.channels.clients import redis_client
from shared.channels.ratelimit import Limiter
from shared.constants import KEY_SENT, KEY_UNDELIVERED, T_OUTBOUND_DELIVER
from shared.db import unavailable
from shared.errors import Retryable
from shared.models import Outbox, OutboxStatus, SentFile
from shared.outbox import FILE
from shared.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")
UNBOUNDED = 1_000_000  # Celery's retry count never ends a delivery; the row's attempts do
EARLY = 2.0  # a retry this much ahead of its row's next_attempt_at re-arms itself (clock skew)
BATCH = 200
AHEAD_WAIT = 0.3  # seconds before a row that waits for an earlier reply to its chat looks again
SENT_TTL = 7 * 24 * 3600  # a "sent" marker outlives any retry or redelivery of its row
CLAIM_MARGIN = 2.0  # stop retrying the mark this long before the claim lapses
THROTTLES_PER_ATTEMPT = 10  # a platform may throttle a row ten times as often as it may fail it
EARLIER_FAILED = "an earlier chunk of this reply failed"
MAX_ERROR = 1000  # characters of a platform's own account of a failure
_channels: dict[tuple[str, int], Channel] = {}


def channel_for(settings: Settings, name: str) -> Channel | None:
    """The process's instance of a platform (built once per settings object)."""
    key = (name, id(settings))
    if key not in _channels and name in REGISTRY:
        _channels[key] = REGISTRY[name](settings)
    return _channels.get(key)


def limiter(settings: Settings) -> Limiter:
    return Limiter(redis_client(settings.redis_url))


def reply_prefix(row: Outbox) -> str:
    return row.key.rsplit(":", 1)[0]


def chunk_key(row: Outbox, offset: int) -> str:
    return f"{reply_prefix(row)}:{int(row.meta.get('chunk', 0)) + offset}"


# --------------------------------------------------------------------------- delivery


def deliver(rt: Runtime, outbox_id: str) -> list[Next]:
    """Send one row once; returns the delivery of the reply's next chunk. Raises Retryable to be
    run again later (rate limited, or a failure with attempts left)."""
    row = _due(rt, outbox_id)
    if row is None:
        return []
    claimed_at, claimed_before = time.monotonic(), row.next_attempt_at is not None
    if not _claim(rt, outbox_id):
        return _not_claimed(rt, outbox_id)
    # Only a row someone claimed before can have gone out with its mark lost: a first send skips the look-up.
    if claimed_before and (earlier := _before_send(rt, row, lambda: _sent_marker(rt, outbox_id))) is not None:
        _delivered(rt, row, earlier, claimed_at)
        return _next_chunk(rt, row)
    ch = channel_for(rt.settings, row.channel)
    if ch is None or not ch.enabled():
        _dead(rt, row, f"channel {row.channel!r} is not configured")
        return []
    buckets = ch.rate_limits(row.chat_id)
    wait = _before_send(rt, row, lambda: limiter(rt.settings).acquire(buckets))
    if wait > 0:
        _schedule(rt, row, wait)
        raise Retryable(f"{row.channel} {row.chat_id}: rate limited", delay=wait, max_retries=UNBOUNDED)
    try:
        result = _send(rt, ch, row)
    except RateLimited as err:
        if buckets:
            limiter(rt.settings).penalize(buckets[0], err.retry_after)
        return _throttled(rt, row, err)
    except Rejected as err:  # one attempt, refused for good
        _dead(rt, row, str(err), attempts=row.attempts + 1)
        return []
    except Exception as err:
        return _failed(rt, row, f"{type(err).__name__}: {err}", delay=None)
    _delivered(rt, row, result, claimed_at)
    return _next_chunk(rt, row)


def _before_send(rt: Runtime, row: Outbox, look: Callable[[], T]) -> T:
    """`look` (a Redis look-up before the send). Redis failing there, nothing was sent: the row is
    claimed again after a short delay, not held for its whole claim (with the chat's later replies
    waiting behind it)."""
    try:
        return look()
    except (RedisConnectionError, RedisTimeoutError) as err:  # (an error Redis answers is no outage: it raises)
        delay = rt.settings.channels.delivery.retry_base_delay
        log.warning("outbox %s (%s %s): Redis failed before the send, nothing was sent; again in %.0f s: %s",
                    row.id, row.channel, row.chat_id, delay, err)
        _schedule(rt, row, delay)
        raise Retryable(f"Redis before the send: {err}", delay=delay, max_retries=UNBOUNDED) from err


def _send(rt: Runtime, ch: Channel, row: Outbox) -> SendResult:
    """One row to the platform: its text, or the file it names (read from Postgres only now)."""
    meta = {**row.meta, "outbox_id": row.id}
    named = row.meta.get(FILE)
    if not named:
        return ch.send(row.chat_id, row.content, meta)
    with rt.session() as s:
        data = s.exec(select(SentFile.data).where(SentFile.id == named["id"])).first()
    if data is None:
        raise Rejected(f"the file {named['name']!r} is gone (its conversation was deleted)")
    return ch.send_file(row.chat_id, OutFile(named["name"], named["mime"], data), meta)


def _due(rt: Runtime, outbox_id: str) -> Outbox | None:
    """The row, if it is pending and its turn has come: chunk i goes out only after chunk i-1 was
    delivered (whose delivery enqueues i). After a failed chunk i-1, sending i would show the reply
    out of order, so i is dead-lettered too; a retry restarts the reply from its first failed chunk.
    A row of a chat waits for the rows made before it for that chat that are going out (being sent,
    or waiting out a rate limit; not those failing, which could take an hour): the chunks of a long
    reply then arrive together, with no later reply between them, and replies in the order made."""
    with rt.session() as s:
        row = s.get(Outbox, outbox_id)
        if row is None or row.status != OutboxStatus.PENDING:
            return None
        previous = None
        if int(row.meta.get("chunk", 0)):
            previous = s.exec(select(Outbox.status).where(Outbox.key == chunk_key(row, -1))).first()
        ahead = s.exec(select(Outbox.id).where(
            Outbox.channel == row.channel, Outbox.chat_id == row.chat_id, Outbox.status == OutboxStatus.PENDING,
            Outbox.attempts == 0, col(Outbox.created_at) < row.created_at).limit(1)).first()
    if previous == OutboxStatus.FAILED:
        _dead(rt, row, EARLIER_FAILED, unless_claimed=True)
    if previous not in (None, OutboxStatus.DELIVERED):
        return None
    if ahead is not None:
        raise Retryable(f"{row.channel} {row.chat_id}: an earlier reply is still going out", delay=AHEAD_WAIT,
                        max_retries=UNBOUNDED)
    return row


def _claim(rt: Runtime, outbox_id: str) -> bool:
    """Take the row for one send: nobody else may until next_attempt_at, pushed past the send."""
    claim = timedelta(seconds=rt.settings.channels.delivery.claim_seconds)
    with rt.session() as s:
        taken = s.execute(
            update(Outbox)
            .where(col(Outbox.id) == outbox_id, col(Outbox.status) == OutboxStatus.PENDING,
                   (col(Outbox.next_attempt_at).is_(None)) | (col(Outbox.next_attempt_at) <= func.now()))
            .values(next_attempt_at=func.now() + claim)
        )
        return bool(taken.rowcount == 1)  # type: ignore[attr-defined]


def _not_claimed(rt: Runtime, outbox_id: str) -> list[Next]:
    """Another task owns the row (sending, or scheduled to retry). A retry that arrived a little
    early (clocks differ between hosts) re-arms itself instead of leaving the row to the sweeper."""
    with rt.session() as s:
        ahead = s.execute(
            select(func.extract("epoch", col(Outbox.next_attempt_at) - func.now()))
            .where(col(Outbox.id) == outbox_id, col(Outbox.status) == OutboxStatus.PENDING)
        ).scalar()
    if ahead is not None and 0 < float(ahead) <= EARLY:
        raise Retryable("retry arrived early", delay=float(ahead) + 0.05, max_retries=UNBOUNDED)
    return []


def _schedule(rt: Runtime, row: Outbox, delay: float, *, error: str | None = None, count: bool = False,
              meta: dict[str, Any] | None = None) -> None:
    values: dict[str, Any] = {"next_attempt_at": func.now() + timedelta(seconds=delay)}
    if error is not None:
        values["last_error"] = error
    if count:
        values["attempts"] = col(Outbox.attempts) + 1
    if meta is not None:
        values["meta"] = meta
    with rt.session() as s:
        s.execute(update(Outbox).where(col(Outbox.id) == row.id).values(**values))


def _failed(rt: Runtime, row: Outbox, error: str, *, delay: float | None) -> list[Next]:
    """Count the attempt; retry with backoff (or the platform's retry_after), or dead-letter."""
    cfg = rt.settings.channels.delivery
    attempts = row.attempts + 1
    if attempts >= cfg.max_attempts:
        _dead(rt, row, error, attempts=attempts)
        return []
    if delay is None:  # exponential backoff with full jitter
        delay = random.uniform(cfg.retry_base_delay / 2, min(cfg.retry_max_delay, cfg.retry_base_delay * 2**attempts))
    log.warning("outbox %s (%s %s): attempt %d failed, retry in %.1fs: %s",
                row.id, row.channel, row.chat_id, attempts, delay, error)
    _schedule(rt, row, delay, error=error, count=True)
    raise Retryable(error, delay=delay, max_retries=UNBOUNDED)


def _throttled(rt: Runtime, row: Outbox, err: RateLimited) -> list[Next]:
    """The platform said 429: wait as it asks, without counting an attempt (ten throttles are not
    ten failures). Throttles are counted apart, in the row's meta, so a platform that never stops
    throttling still dead-letters the row after THROTTLES_PER_ATTEMPT times MAX_ATTEMPTS."""
    throttles = int(row.meta.get("throttled", 0)) + 1
    error = f"rate limited by the platform {throttles} times: {err}"
    if throttles >= THROTTLES_PER_ATTEMPT * rt.settings.channels.delivery.max_attempts:
        _dead(rt, row, error)
        return []
    _schedule(rt, row, err.retry_after, error=error, meta={**row.meta, "throttled": throttles})
    raise Retryable(error, delay=err.retry_after, max_retries=UNBOUNDED)


def _dead(rt: Runtime, row: Outbox, error: str, *, attempts: int | None = None, unless_claimed: bool = False) -> None:
    """Dead-letter the row, if it is still pending, and the rest of its reply so nothing arrives out
    of order. `unless_claimed`: not while another worker holds the row's claim (it may be sending it
    right now: a dead letter of a chunk that went out would be sent again by a retry)."""
    later = [chunk_key(row, i) for i in range(1, int(row.meta.get("chunks", 1)) - int(row.meta.get("chunk", 0)))]
    with rt.session() as s:
        pending = [col(Outbox.id) == row.id, col(Outbox.status) == OutboxStatus.PENDING]
        if unless_claimed:
            pending.append(col(Outbox.next_attempt_at).is_(None) | (col(Outbox.next_attempt_at) <= func.now()))
        if not s.connection().execute(update(Outbox).where(*pending).values(
                status=OutboxStatus.FAILED, last_error=error, next_attempt_at=None,
                attempts=attempts if attempts is not None else row.attempts)).rowcount:
            return
        log.error("outbox %s (%s %s): giving up: %s", row.id, row.channel, row.chat_id, error)
        if later:
            s.execute(update(Outbox)
                      .where(col(Outbox.key).in_(later), col(Outbox.status) == OutboxStatus.PENDING)
                      .values(status=OutboxStatus.FAILED, last_error=EARLIER_FAILED))


def _delivered(rt: Runtime, row: Outbox, result: SendResult, claimed_at: float) -> None:
    """Mark the row delivered. The platform has it, so a database error here must not lead to a
    resend: retry while this worker still holds the claim, then leave the fact in Redis."""
    budget = claimed_at + rt.settings.channels.delivery.claim_seconds - CLAIM_MARGIN - time.monotonic()
    try:
        for attempt in Retrying(retry=retry_if_exception(unavailable), reraise=True,
                                stop=stop_before_delay(max(budget, 0.0)), wait=wait_exponential(0.1, max=2.0),
                                before_sleep=lambda state: log.warning(
                                    "outbox %s: sent; marking it delivered failed, retrying: %s",
                                    row.id, state.outcome.exception() if state.outcome else None)):
            with attempt, rt.session() as s:
                mark = (update(Outbox).where(col(Outbox.id) == row.id, col(Outbox.status) == OutboxStatus.PENDING)
                        .values(status=OutboxStatus.DELIVERED, platform_message_id=result.platform_message_id,
                                delivered_at=func.now(), next_attempt_at=None, last_error=None))
                marked = s.connection().execute(mark).rowcount
    except Exception as err:
        if not unavailable(err):
            raise
        log.error("outbox %s: sent, but the database could not be told; the next claim will not resend", row.id)
        redis_client(rt.settings.redis_url).set(
            KEY_SENT + row.id, json.dumps({"platform_message_id": result.platform_message_id}), ex=SENT_TTL)
        raise
    if not marked:  # dead-lettered or resent meanwhile: what the platform has is not the row's to say
        log.warning("outbox %s: sent (platform id %s), but it was no longer pending: left as it is",
                    row.id, result.platform_message_id)
        return
    _reported_early(rt, row, result)


def _sent_marker(rt: Runtime, outbox_id: str) -> SendResult | None:
    """What a worker sent but could not mark, taken (a marker left behind would count a later send of
    the row, after an operator's retry, as done); _delivered leaves it again if it cannot mark either."""
    raw = redis_client(rt.settings.redis_url).getdel(KEY_SENT + outbox_id)
    return SendResult(json.loads(raw)["platform_message_id"]) if raw else None


def _next_chunk(rt: Runtime, row: Outbox) -> list[Next]:
    if int(row.meta.get("chunk", 0)) + 1 >= int(row.meta.get("chunks", 1)):
        return []
    with rt.session() as s:
        nxt = s.exec(select(Outbox.id).where(Outbox.key == chunk_key(row, 1),
                                             Outbox.status == OutboxStatus.PENDING)).first()
    return [Next(T_OUTBOUND_DELIVER, (nxt,))] if nxt else []


# --------------------------------------------------------------------------- dead letters, sweeper


def retry(s: Session, row: Outbox) -> list[Next]:
    """Send a dead-lettered reply again from its first failed chunk, whichever chunk was asked for
    (the list is newest first): its failed chunks go back to pending in the caller's transaction and
    the first is enqueued; each delivery enqueues the next, so every chunk arrives once, in order.
    Only failed rows change: a pending one may be in a worker's hands right now."""
    keys = [f"{reply_prefix(row)}:{i}" for i in range(int(row.meta.get("chunks", 1)))]
    reset = (update(Outbox).where(col(Outbox.key).in_(keys), col(Outbox.status) == OutboxStatus.FAILED)
             .values(status=OutboxStatus.PENDING, attempts=0, next_attempt_at=None, last_error=None,
                     meta=type_coerce(col(Outbox.meta), JSONB).delete_path(["throttled"]))
             .returning(col(Outbox.id), col(Outbox.key)))
    failed = s.execute(reset).all()
    if not failed:
        return []
    first = min(failed, key=lambda r: int(r.key.rsplit(":", 1)[1]))
    return [Next(T_OUTBOUND_DELIVER, (first.id,))]


def undelivered(rt: Runtime, channel: str, failures: dict[str, str]) -> list[str]:
    """Dead-letter delivered rows the platform reported, later, as not delivered (WhatsApp's
    failed statuses: the 24-hour window had closed, the number is not on WhatsApp...), so they
    show at GET /api/v1/outbox?status=failed and can be retried. Returns the rows' ids. A report
    about a send not recorded yet (the platform answered; the mark is on its way) waits in Redis
    for that mark (_delivered); a repeated one, or one about a message we did not send, changes nothing."""
    with rt.session() as s:
        rows = s.exec(select(Outbox).where(Outbox.channel == channel,
                                           col(Outbox.platform_message_id).in_(list(failures)))).all()
        hit = [row for row in rows if row.status == OutboxStatus.DELIVERED]
        for row in hit:
            why = failures[str(row.platform_message_id)][:MAX_ERROR]
            log.error("outbox %s (%s %s): the platform reports it was not delivered: %s", row.id, channel,
                      row.chat_id, why)
            row.status, row.last_error = OutboxStatus.FAILED, f"not delivered: {why}"
            s.add(row)
    known = {row.platform_message_id for row in rows}
    early = {pid: why for pid, why in failures.items() if pid not in known}
    if early:
        pipe = redis_client(rt.settings.redis_url).pipeline(transaction=False)
        for pid, why in early.items():
            pipe.set(f"{KEY_UNDELIVERED}{channel}:{pid}", why[:MAX_ERROR], ex=SENT_TTL)
        pipe.execute()
    return [row.id for row in hit]


def _reported_early(rt: Runtime, row: Outbox, result: SendResult) -> None:
    """The platform's failure report for this send, if it came before the send was recorded. The
    row went out and is marked: an error here is logged, never a reason to send it again."""
    ch = channel_for(rt.settings, row.channel)
    if ch is None or not ch.reports_failures or not result.platform_message_id:
        return
    try:
        why = redis_client(rt.settings.redis_url).getdel(f"{KEY_UNDELIVERED}{row.channel}:{result.platform_message_id}")
        if why:
            text = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
            undelivered(rt, row.channel, {result.platform_message_id: text})
    except Exception as err:
        if not (isinstance(err, RedisError) or unavailable(err)):
            raise
        log.warning("outbox %s: could not check for an early failure report: %s", row.id, err)


# Pending rows nobody touched for a while (their task was lost), whose previous chunk is not
# pending; stamped so the next sweep leaves them alone for another `grace` seconds.
_STALE = text("""
update outbox set next_attempt_at = now()
where id in (
  select o.id from outbox o
  where o.status = 'pending'
    and coalesce(o.next_attempt_at, o.created_at) < now() - make_interval(secs => :grace)
    and not exists (
      select 1 from outbox p where p.status = 'pending'
        and p.key = regexp_replace(o.key, '[0-9]+$', '') || (coalesce((o.meta->>'chunk')::int, 0) - 1))
  order by o.created_at limit :batch for update skip locked)
returning id
""")


def redeliver(rt: Runtime) -> list[Next]:
    """An extra sweep: re-enqueue rows whose delivery task was lost."""
    with rt.session() as s:
        params = {"grace": rt.settings.channels.delivery.redeliver_after, "batch": BATCH}
        ids = s.execute(_STALE, params).scalars().all()
    if ids:
        log.info("outbox: re-enqueueing %d row(s) whose delivery task was lost", len(ids))
    return [Next(T_OUTBOUND_DELIVER, (i,)) for i in ids]
