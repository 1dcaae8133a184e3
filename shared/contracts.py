"""Small JSON models that travel between the gateway, the queue and the workers."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, model_validator

LONE_SURROGATE = re.compile("[\ud800-\udfff]")
NO_NUL = r"^[^\x00]*$"  # Postgres text cannot hold NUL: refuse it as invalid input, not as a database error


# What counts as blank, in Python and in the JSON Schema pattern the API publishes alike (Python's
# isspace() and JSON Schema's \s disagree on some characters: a fuzzer would find the difference)
BLANKS = " \t\n\r\f\v"
NOT_BLANK = r"^[^\x00]*[^\x00 \t\n\r\f\v][^\x00]*$"  # also without NUL (NO_NUL)


def not_blank(text: str) -> str:
    if not text.strip(BLANKS):
        raise ValueError("it is blank: write something")
    return text


# A message (spaces alone start no model call), a title: checked with a clear reason, and the schema says so
Said = Annotated[str, AfterValidator(not_blank), Field(json_schema_extra={"pattern": NOT_BLANK})]


def without_nul(value: Any, *, lone_surrogates: bool = False) -> Any:
    """`value` with NUL characters removed from every string in it: Postgres text and JSONB cannot
    hold them, and no chat platform shows them. With `lone_surrogates`, a lone UTF-16 surrogate (JSON
    may spell one; UTF-8, and so Postgres, cannot hold it) becomes U+FFFD, as a platform's message is
    taken whatever it holds."""
    if isinstance(value, dict | list) and _clean(value, lone_surrogates=lone_surrogates):
        return value
    if isinstance(value, str):
        value = value.replace("\x00", "")
        return LONE_SURROGATE.sub("\ufffd", value) if lone_surrogates else value
    if isinstance(value, dict):
        return {without_nul(k, lone_surrogates=lone_surrogates): without_nul(v, lone_surrogates=lone_surrogates)
                for k, v in value.items()}
    if isinstance(value, list):
        return [without_nul(v, lone_surrogates=lone_surrogates) for v in value]
    return value


def _clean(value: dict[Any, Any] | list[Any], *, lone_surrogates: bool) -> bool:
    """Whether no string in `value` holds a NUL (or a lone surrogate): one pass in C over its repr,
    which spells both escaped (\\x00, \\udXXX), instead of a Python call per string. It may say no
    when the answer is yes (a printed "\\x00"), never the reverse."""
    spelled = repr(value)
    return "\\x00" not in spelled and not (lone_surrogates and "\\ud" in spelled)


class InboundMessage(BaseModel):
    """A message from a user on some channel, normalised by the channel module."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        return without_nul(data, lone_surrogates=True)

    channel: str
    chat_id: str
    sender_id: str
    content: str
    event_id: str
    session_key: str = ""  # defaults to "<channel>:<chat_id>"; Slack threads use their own
    reply_meta: dict[str, Any] = Field(default_factory=dict)  # what a reply needs (thread ts...)
    sender_name: str | None = None
    group: bool = False  # a chat of several people: the model is told who wrote each message
    # What a person sent that has no text for the model ("a voice message"): answered with a notice
    # that says so, without an LLM call, instead of silence.
    unsupported: str | None = None
    # A voice message's audio or a photo on the platform ({"kind": "voice" or "photo"..., "id": the
    # platform's file id}): the worker fetches it, and a transcription model's words become the content;
    # a photo goes to a model that sees images (shared.channels.media).
    media: dict[str, str] | None = None
    # The message's further attachments, photos or files (a Feishu post or a Slack message may hold
    # several), fetched after `media`, in order.
    more_media: list[dict[str, str]] = Field(default_factory=list)
    # The photos fetched, each {"mime": "image/jpeg", "data": base64}, on their way to the conversation.
    images: list[dict[str, str]] = Field(default_factory=list)
    # What to answer instead of a turn (a voice message that could not be transcribed: why).
    notice: str | None = None
    # The album it is an item of (Telegram's media_group_id; on WhatsApp and Feishu, a photo's chat's
    # BURST): an album is submitted as one message (shared.channels.albums).
    album: str | None = None
    # An album item in a group that does not address the bot (no caption): taken in only with an item of
    # its album that does.
    follower: bool = False

    def key(self) -> str:
        return self.session_key or f"{self.channel}:{self.chat_id}"

    def blank(self) -> bool:
        """Nothing to answer: no words (an empty or blank text, a mention of the bot alone in a private
        chat), nothing attached, nothing to be told about."""
        return not (self.content.strip() or self.unsupported or self.media or self.more_media or self.images
                    or self.notice)

    def answered(self, notice: str) -> InboundMessage:
        """This message with `notice` to answer instead of a turn (its attachment dropped)."""
        return self.model_copy(update={"media": None, "more_media": [], "notice": notice})


class OutboundMessage(BaseModel):
    """Text to deliver to one chat on one channel."""

    channel: str
    chat_id: str
    content: str
    meta: dict[str, Any] = Field(default_factory=dict)
