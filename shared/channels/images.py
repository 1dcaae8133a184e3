"""Photos sent in a chat. When a model the operator configured sees images (its profile's `vision`, or
litellm's model map), the worker that submits a photo fetches it from the platform and it goes to the
conversation with its caption (shared.models.MessageImage); the model of the turn that answers it is
shown it (shared.agent.prompt). When none does, a captioned photo's caption goes on with a note that a
photo came with it, and a photo alone gets the notice that only text is read. Where files are kept
(NANOFLEET_CHANNELS__SAVE_FILES), photos are fetched and kept in the workspace whoever sees them, and
the model is told where (a photo alone then goes to it too: its tools may open it)."""

from __future__ import annotations

import base64
import logging

from shared.agent.runtime import Runtime
from shared.channels.base import image_type
from shared.contracts import InboundMessage

log = logging.getLogger(__name__)
UNSEEN = "[The user sent a photo with this message; you cannot see images.]\n"
UNSEEN_SOME = "[The user sent {n} photos with this message; you cannot see images.]\n"
KEPT = "[photo saved as {path}]"
KEPT_UNSEEN = "[The user sent a photo, saved as {path}; you cannot see images.]"
EXTENSIONS = {"image/jpeg": "jpg"}
NOT_AN_IMAGE = "Sorry, I can only look at JPEG, PNG, GIF and WebP images. Could you send it as one of those?"


def wanted(rt: Runtime) -> bool:
    """Whether photos are fetched: the default model, or one of the profiles, sees images."""
    return any(rt.llm.sees_images(model) for model in (None, *rt.settings.llm.profiles))


def attached(msg: InboundMessage, data: bytes, kept: str | None = None) -> InboundMessage:
    """`msg` with its photo (fetched by shared.channels.media) and where it was kept in the workspace
    (`kept`) if it was, or with the notice its sender gets when it is no image a model takes."""
    mime = image_type(data)
    if mime is None:
        log.warning("inbound event %s: its photo is no image a model takes (%d bytes)", msg.event_id, len(data))
        return msg.answered(NOT_AN_IMAGE)
    log.info("inbound event %s: photo of %d bytes fetched (%s)", msg.event_id, len(data), mime)
    image = {"mime": mime, "data": base64.b64encode(data).decode()}
    content = _with(msg.content, KEPT.format(path=kept)) if kept else msg.content
    return msg.model_copy(update={"media": None, "unsupported": None, "images": [*msg.images, image],
                                  "content": content})


def unseen_kept(msg: InboundMessage, kept: str) -> InboundMessage:
    """`msg` for a model that sees no images, its photo kept in the workspace: it goes to the model
    (a photo alone too), saying where, for its tools to open."""
    content = _with(msg.content, KEPT_UNSEEN.format(path=kept))
    return msg.model_copy(update={"media": None, "unsupported": None, "content": content})


def named(name: str, data: bytes) -> str:
    """A kept photo's name: the platform's, with the extension its bytes call for when it has none."""
    mime = image_type(data)
    if mime and "." not in name.rsplit("/", 1)[-1]:
        return f"{name}.{EXTENSIONS.get(mime, mime.split('/')[1])}"
    return name


def _with(content: str, note: str) -> str:
    return f"{content}\n\n{note}" if content.strip() else note


def unseen(msg: InboundMessage) -> InboundMessage:
    """`msg` for a model that sees no images: its caption, saying photos came with it (photos
    alone keep `unsupported`: their sender is told that only text is read)."""
    rest = [m for m in msg.more_media if m.get("kind") != "photo"]  # (its files are read all the same)
    if not msg.content.strip():
        return msg.model_copy(update={"media": None, "more_media": rest})
    photos = 1 + len(msg.more_media) - len(rest)
    said = UNSEEN if photos == 1 else UNSEEN_SOME.format(n=photos)
    return msg.model_copy(update={"media": None, "more_media": rest, "content": said + msg.content})
