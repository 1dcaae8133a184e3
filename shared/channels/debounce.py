"""Debouncing: a person who writes in bursts ("hi", "can you", "look at the logs?"), or whose app
splits a long paste into several messages (Telegram's does past 4096 characters), gets one answer to
all of it. Where a chat platform's `debounce` is set (NANOFLEET_CHANNELS__<PLATFORM>__DEBOUNCE,
seconds; 0 by default: off), a text message waits until its sender has sent nothing more for that
long, and the texts that came meanwhile go on as one message (shared.channels.inbound), answered
once, in reply to the last. A command, a message with an attachment or another sender's ends the
burst before it, which then goes on at once; they are never held or joined.

Without a debounce, a Telegram text of SPLIT_AT characters or more waits SPLIT_WAIT all the same: it
is most likely the first part of a paste the app split, and the rest is on its way."""

from __future__ import annotations

from collections.abc import Iterable

from shared.agent.service import command_of
from shared.channel_settings import ChannelsSettings
from shared.contracts import InboundMessage

# Characters from which a text is taken for the first part of a split paste: Telegram's apps cut one
# into messages of up to 4096 characters (UTF-16 units), at a line or word break near the end.
SPLIT_AT = {"telegram": 3500}
SPLIT_WAIT = 1.5  # seconds
LONGEST = 60.0  # seconds a burst's first message waits at most, however long its sender goes on


def wait(settings: ChannelsSettings, msg: InboundMessage) -> float:
    """How long the message waits for its sender's next one (0: it goes on at once)."""
    if not joinable(msg):
        return 0.0
    configured = settings.debounce(msg.channel)
    split = msg.channel in SPLIT_AT and len(msg.content) >= SPLIT_AT[msg.channel]
    return configured or (SPLIT_WAIT if split else 0.0)


def joinable(msg: InboundMessage) -> bool:
    """Whether the message may wait for more and be joined: plain text, no command."""
    attached = msg.media or msg.more_media or msg.images or msg.album or msg.notice or msg.unsupported
    return not attached and bool(msg.content.strip()) and not command_of(msg.content)


def burst(first: InboundMessage, later: Iterable[InboundMessage]) -> tuple[list[InboundMessage], bool]:
    """`first` and the messages after it (the next of its chat, in order, read as far as needed) that
    join it, and whether its burst is over (a message came after them that does not join)."""
    joined = [first]
    for msg in later:
        if not joinable(msg) or msg.sender_id != first.sender_id:
            return joined, True
        joined.append(msg)
    return joined, False


def holding(wait: float, over: bool, quiet: float, first_age: float) -> float:
    """Seconds a burst still waits (0: it goes on now): until its sender was `quiet` for `wait`
    seconds, unless it is over, or its first message has waited LONGEST."""
    return 0.0 if over else max(0.0, min(wait - quiet, LONGEST - first_age))


def joined(burst: list[InboundMessage]) -> InboundMessage:
    """The burst as one message: its texts in order, one per line; the last's event and reply."""
    return burst[-1].model_copy(update={"content": "\n".join(msg.content for msg in burst)})
