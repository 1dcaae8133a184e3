"""The outbox: one row per outbound chunk or file with a unique key, delivered by the outbound queue; and
the "typing..." loop a turn starts there."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.dialects.postgresql import insert
from sqlmodel import Session, col, select

from shared.agent.runtime import Next
from shared.channels import get_channel
from shared.channels.base import default_chunks
from shared.constants import EMPTY_ANSWER, T_OUTBOUND_DELIVER, T_OUTBOUND_TYPING
from shared.models import Outbox, OutboxStatus, new_id, utcnow
from shared.settings import Settings

FALLBACK_LIMIT = 4000
FILE = "file"  # an outbox row's meta key: the SentFile it delivers (its id, name and mime)
# Seconds into a turn before its first "typing...": a reply that comes sooner needs none, and spends no
# platform API call on it (Telegram counts sendChatAction against the bot's limits); the delayed task
# then finds the run ended and sends nothing.
TYPING_AFTER = 1.0


def add_reply(
    s: Session, settings: Settings, *, key: str, channel: str, chat_id: str, text: str, meta: dict[str, Any],
    run_id: str | None = None, files: Sequence[dict[str, str]] = (),
) -> list[Next]:
    """Chunk `text` for the channel and store one row per chunk, then one per file (`files`: the
    id, name and mime of SentFile rows), delivered in that order; a key seen before adds nothing."""
    parts = _chunks(settings, channel, text)
    items: list[tuple[str, dict[str, Any]]] = [(part, {}) for part in parts] + [("", {FILE: dict(f)}) for f in files]
    total = len(items)
    for i, (part, extra) in enumerate(items):
        s.execute(
            insert(Outbox)
            .values(id=new_id(), key=f"{key}:{i}", channel=channel, chat_id=chat_id, content=part,
                    meta={**meta, **extra, "chunk": i, "chunks": total}, status=OutboxStatus.PENDING.value,
                    attempts=0, created_at=utcnow(), run_id=run_id)
            .on_conflict_do_nothing(index_elements=["key"])
        )
    keys = [f"{key}:{i}" for i in range(total)]
    rows = s.exec(select(Outbox).where(col(Outbox.key).in_(keys), Outbox.status == OutboxStatus.PENDING)).all()
    return [Next(T_OUTBOUND_DELIVER, (row.id,)) for row in sorted(rows, key=lambda r: int(r.meta.get("chunk", 0)))]


def _chunks(settings: Settings, channel: str, text: str) -> list[str]:
    """`text` as the channel's chunks. A text with something in it that shows nothing once formatted (the
    model answered an empty code block) goes as the notice a turn that answered nothing gets: a reply
    that made no row would reach nobody, and leave Discord's "thinking..." as it was."""
    ch = get_channel(channel, settings)
    chunk: Callable[[str], list[str]] = ch.chunks if ch else lambda t: default_chunks(t, FALLBACK_LIMIT)
    parts = chunk(text) if text else []
    if parts or not text.strip():
        return parts
    return chunk(EMPTY_ANSWER)


def typing_loop(settings: Settings, origin: dict[str, Any], run_id: str) -> list[Next]:
    """The "typing..." loop (shared.channels.typing_indicator) for a turn whose first step starts
    now, in a chat whose platform shows one, from TYPING_AFTER on while the turn lasts; the turn came
    from a webhook or from the mailbox."""
    ch = get_channel(str(origin.get("channel")), settings)
    if ch is None or not ch.typing_indicator:
        return []
    meta = origin.get("reply_meta") or {}
    return [Next(T_OUTBOUND_TYPING, (ch.name, str(origin.get("chat_id", "")), run_id, meta, 0), countdown=TYPING_AFTER)]
