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

from typing import Any

from shared.channels.base import MAX_IMAGES
from shared.contracts import InboundMessage

ALBUM_WAIT = 1.0  # seconds: Telegram sends an album's updates one right after another
ALBUM_LONGEST = 10.0  # seconds an album's first item waits at most (its later items go on then)
BURST = "burst"  # the album of a chat's photos that come one per message, without an album id
PASSED_OVER = "[{n} more item(s) came with this message that you were not given: {limit} are read at most.]"
NOT_READ = "[{n} more item(s) came with this message that you were not given (videos and the like).]"


def waiting(first_age: float, last_age: float) -> float:
    """Seconds the album's first item, which came `first_age` seconds ago, still waits for more items,
    its latest having come `last_age` seconds ago (0: it is taken in now)."""
    return max(0.0, min(ALBUM_WAIT - last_age, ALBUM_LONGEST - first_age))


def addressed(items: list[InboundMessage]) -> bool:
    """Whether the album is for the bot: in a group, only if its caption says so."""
    return any(not item.follower for item in items)


def merged(items: list[InboundMessage]) -> InboundMessage:
    """The album's items as one message, the first's that addresses the bot (its event, chat, sender
    and reply), the followers after it: the captions in order, and the attachments, fetched or still to
    fetch, MAX_IMAGES at most (the model is told of the rest). An item whose attachment could not be
    taken in makes the album's notice, as the first attachment of a message that fails does."""
    items = [*(i for i in items if not i.follower), *(i for i in items if i.follower)]
    first = items[0]
    attachments: list[tuple[str, Any]] = []  # ("image", fetched) or ("media", to fetch), in order
    unread = 0
    for item in items:
        found = [("image", i) for i in item.images] + [("media", m) for m in ([item.media] if item.media else [])]
        found += [("media", m) for m in item.more_media]
        attachments += found
        unread += not found and not item.content.strip()
    captions = [item.content for item in items if item.content.strip()]
    if not (attachments or captions):  # nothing to read (videos): its sender is told so, once
        return first
    kept, over = attachments[:MAX_IMAGES], len(attachments) - MAX_IMAGES
    if over > 0:
        captions.append(PASSED_OVER.format(n=over, limit=MAX_IMAGES))
    if unread:
        captions.append(NOT_READ.format(n=unread))
    content = "\n\n".join(captions)
    images = [a for kind, a in kept if kind == "image"]
    to_fetch = [a for kind, a in kept if kind == "media"]
    return first.model_copy(update={
        "content": content, "images": images, "media": to_fetch[0] if to_fetch else None, "more_media": to_fetch[1:],
        "notice": next((item.notice for item in items if item.notice), None),
        "unsupported": None if content or images else first.unsupported,
    })
