"""Albums: several photos or files sent at once on Telegram come as one update per item, sharing a
media group id, the caption with one of them. They are answered as one message: the album's first item
waits for the others until none came for ALBUM_WAIT seconds (ALBUM_LONGEST at most from its own
arrival), then takes in those that came, with their attachments and captions (shared.channels.inbound),
as a Slack message with several files is taken in. Without this, each photo was a message of its own:
a reply each, or a notice each.

In a group only the item with the caption can address the bot; the others follow it (`follower`):
taken in with it, or not at all when it does not (or comes too late).

WhatsApp and Feishu send photos picked together as one message each, with no album id: each is an
item of its chat's BURST, one message too. A phone sends them one by one as each is uploaded, a second
or more apart on a slow network: hence the wait after the last item, not the first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shared.channels.base import MAX_IMAGES
from shared.contracts import InboundMessage

ALBUM_WAIT = 1.0  # seconds: Telegram sends an album's updates one right after another
ALBUM_LONGEST = 10.0  # seconds an album's first item waits at most (its later items go on then)
BURST = "burst"  # the album of a chat's photos that come one per message, without an album id
PASSED_OVER = "[{n} more item(s) came with this message that you were not given: {limit} are read at most.]"
NOT_READ = "[{n} more item(s) came with this message that you were not given (videos and the like).]"
UNREAD_ITEM = "[An item of this message was not read; its sender would have been told: {notice}]"


def waiting(first_age: float, last_age: float) -> float:
    """Seconds the album's first item, which came `first_age` seconds ago, still waits for more items,
    its latest having come `last_age` seconds ago (0: it is taken in now)."""
    return max(0.0, min(ALBUM_WAIT - last_age, ALBUM_LONGEST - first_age))


def addressed(items: list[InboundMessage]) -> bool:
    """Whether the album is for the bot: in a group, only if its caption says so."""
    return any(not item.follower for item in items)


def ordered(items: list[InboundMessage]) -> list[InboundMessage]:
    """The album's items in the order they are taken in: those that address the bot, then the followers."""
    return [*(i for i in items if not i.follower), *(i for i in items if i.follower)]


def _attachments(item: InboundMessage) -> list[tuple[str, Any]]:
    """The item's attachments: ("image", fetched) or ("media", to fetch), in order."""
    return [*(("image", i) for i in item.images), *(("media", m) for m in ([item.media] if item.media else [])),
            *(("media", m) for m in item.more_media)]


def _count(item: InboundMessage) -> int:
    """How many attachments the item came with: one when it holds none any more but is no video or the
    like (its photo or file was prepared ahead of the album: shared.channels.media)."""
    return len(_attachments(item)) or (0 if item.unsupported else 1)


def _said(item: InboundMessage) -> str:
    """What the item says to the model: its caption, and what became of an attachment not read (an
    item whose notice its sender would have had alone is only that, for the model)."""
    if item.notice and not item.content.strip():
        return UNREAD_ITEM.format(notice=item.notice)
    return item.content


def merged(items: list[InboundMessage],
           prepare: Callable[[InboundMessage], InboundMessage] = lambda item: item) -> InboundMessage:
    """The album's items as one message, the first's that addresses the bot (its event, chat, sender
    and reply), the followers after it: the captions in order, and the attachments, fetched or still to
    fetch, MAX_IMAGES at most (the model is told of the rest). Only the items holding those are
    prepared (`prepare`: their attachments fetched, kept in the workspace); the others are passed over
    unfetched, their captions read. An item whose attachment could not be taken in is a line for the
    model (which one, and why: shared.channels.media) when anything else of the album is read; its
    notice is the album's only when nothing is."""
    items, passed = _given(ordered(items), prepare)
    first = items[0]
    attachments = [a for item in items for a in _attachments(item)]
    unread = sum(1 for item in items if not (_attachments(item) or item.content.strip() or item.notice))
    captions = [_said(item) for item in items if item.content.strip() or item.notice]
    if not (attachments or captions or passed):  # nothing to read (videos): its sender is told so, once
        return first
    readable = attachments or any(item.content.strip() for item in items if not item.notice)
    notice = None if readable else next((item.notice for item in items if item.notice), None)
    kept, over = attachments[:MAX_IMAGES], max(len(attachments) - MAX_IMAGES, 0) + passed
    if over > 0:
        captions.append(PASSED_OVER.format(n=over, limit=MAX_IMAGES))
    if unread:
        captions.append(NOT_READ.format(n=unread))
    content = "\n\n".join(captions)
    images = [a for kind, a in kept if kind == "image"]
    to_fetch = [a for kind, a in kept if kind == "media"]
    return first.model_copy(update={
        "content": content, "images": images, "media": to_fetch[0] if to_fetch else None, "more_media": to_fetch[1:],
        "notice": notice, "unsupported": None if content or images else first.unsupported,
    })


def _given(items: list[InboundMessage],
           prepare: Callable[[InboundMessage], InboundMessage]) -> tuple[list[InboundMessage], int]:
    """The items, prepared while their attachments are among the first MAX_IMAGES; past those, an item
    keeps only its caption (none: it is left out). And how many attachments were passed over so."""
    given, seen, passed = [], 0, 0
    for item in items:
        count = _count(item)
        if seen < MAX_IMAGES or not count:
            given.append(prepare(item))
        else:
            passed += count
            if item.content.strip():
                given.append(item.model_copy(update={"media": None, "more_media": [], "images": [],
                                                     "unsupported": None}))
        seen += count
    return given, passed
