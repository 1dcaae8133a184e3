"""The channel contract: one module per platform verifies and parses inbound webhooks and
formats, chunks and sends outbound messages."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from shared.channel_settings import ChannelBase
from shared.channels.markdown import plain_text
from shared.channels.text import format_chunks
from shared.contracts import InboundMessage
from shared.settings import Settings


class WebhookError(Exception):
    """A webhook the gateway must refuse: 401 for a bad signature, 400 for a malformed body, 503
    when the platform must be asked something first and did not answer (it sends the event again)."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or WebhookError(400)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise WebhookError(400, "body is not JSON") from None
    except RecursionError:  # nested deeper than the parser's stack allows
        raise WebhookError(400, "body is nested too deeply") from None
    if not isinstance(data, dict):
        raise WebhookError(400, "body is not a JSON object")
    return data


@dataclass
class Parsed:
    """What a verified webhook contained: messages to process and/or an immediate answer."""

    messages: list[InboundMessage] = field(default_factory=list)
    response: dict[str, Any] | None = None  # e.g. a url_verification challenge or a Discord PONG
    event_id: str | None = None  # for the ledger when the event carries no message
    denied_response: dict[str, Any] | None = None  # the answer when allow_from refuses the sender
    # Messages we sent that the platform reports, later, as not delivered: platform message id -> why.
    undelivered: dict[str, str] = field(default_factory=dict)


@dataclass
class SendResult:
    platform_message_id: str | None = None


@dataclass(frozen=True)
class OutFile:
    """A file the agent sends (the `message` tool's `files`): its name, MIME type and bytes."""

    name: str
    mime: str
    data: bytes

    @property
    def image(self) -> bool:
        """A photo the platform can show as one (its bytes say so, not only its name)."""
        return image_type(self.data) in ("image/jpeg", "image/png")


@dataclass(frozen=True)
class Bucket:
    """A shared rate limit: `burst` sends at once, then one per `interval` seconds."""

    key: str
    interval: float
    burst: int = 1


class Rejected(Exception):
    """The platform refused the message for good (a 4xx other than 429): retrying cannot help.
    `status`: the HTTP status, when the refusal was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RateLimited(Exception):
    """The platform said 429; try again after `retry_after` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate limited, retry after {retry_after}s")
        self.retry_after = retry_after


class Channel(Protocol):
    """A chat platform."""

    name: ClassVar[str]
    max_chars: ClassVar[int]
    typing_indicator: ClassVar[bool]  # shows "typing..." while a turn runs (see typing())
    typing_every: ClassVar[float]  # seconds between its renewals
    reports_failures: ClassVar[bool]  # reports later, by webhook, a sent message it could not deliver
    # Shows each message a placeholder until something is sent for it (Discord's "thinking..."): a turn
    # ends each one it took (shared.agent.finish).
    placeholder: ClassVar[bool]
    # Seconds within which the platform must have the webhook's answer, for a platform that never sends an
    # event again (Discord): the answer then goes out by this deadline even while the message is still being
    # stored. None: the answer waits for the durable write, and a platform that got none sends the event again.
    ack_deadline: ClassVar[float | None]
    max_file_bytes: ClassVar[int]  # the largest file a bot may send there (0: it sends none)

    def enabled(self) -> bool: ...

    def chat_id_problem(self, chat_id: str) -> str | None:
        """Why `chat_id` cannot be a chat of this platform (None when it may be): the `message` tool
        refuses such a target at once, rather than queue a send the platform will refuse."""

    def allowed(self, sender_id: str) -> bool:
        """The sender is in allow_from (default deny; "*" allows everyone)."""

    def rate_limits(self, chat_id: str) -> list[Bucket]:
        """The shared buckets a send to `chat_id` takes a token from, most specific first."""

    def typing(self, chat_id: str, meta: dict[str, Any]) -> bool:
        """Show "typing..." in the chat; False when the platform has no such thing."""

    def verify(self, headers: dict[str, str], body: bytes) -> None:
        """Raise WebhookError(401) unless the request is signed by the platform."""

    def parse(self, headers: dict[str, str], body: bytes) -> Parsed:
        """Raise WebhookError(400) on a malformed body; unknown events give an empty Parsed."""

    def chunks(self, text: str) -> list[str]:
        """The text formatted for the platform and split under its limit."""

    def send(self, chat_id: str, text: str, meta: dict[str, Any]) -> SendResult:
        """Deliver one chunk; raise RateLimited on 429, Rejected when retrying cannot help, other
        exceptions to retry. `meta` holds the reply_meta plus chunk, chunks and outbox_id."""

    def send_file(self, chat_id: str, file: OutFile, meta: dict[str, Any]) -> SendResult:
        """Deliver one file (a JPEG or PNG shown as a photo where the platform shows photos); raise
        as send does. `meta` is send's."""

    def fetch_media(self, media: dict[str, str], limit: int) -> tuple[bytes, str]:
        """The bytes of an attachment a message named (InboundMessage.media) and a file name for
        them; raise Rejected when it is over `limit` bytes or gone, other exceptions to try again."""


# Photos a model is shown: the formats vision models take, and a size every provider accepts (Anthropic's
# cap; OpenAI's is 20 MB). A platform's larger sizes of a photo are passed over for one under it.
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
MAX_IMAGE = 5 * 1024 * 1024
MAX_IMAGES = 4  # photos with one message: a platform's further ones are passed over


def image_type(data: bytes) -> str | None:
    """The image's MIME type, read from its first bytes (what the platform says may be wrong)."""
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


class BaseChannel:
    """Defaults shared by the platform modules: settings, enabled, allow_from, chunking."""

    name: ClassVar[str]
    max_chars: ClassVar[int]
    required: ClassVar[tuple[str, ...]] = ()  # settings fields that must be set for the channel to be on
    typing_indicator: ClassVar[bool] = False
    typing_every: ClassVar[float] = 4.5  # Telegram shows "typing..." for 5 s
    reports_failures: ClassVar[bool] = False
    placeholder: ClassVar[bool] = False
    ack_deadline: ClassVar[float | None] = None
    max_file_bytes: ClassVar[int] = 0

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @property
    def config(self) -> ChannelBase:
        cfg: ChannelBase = getattr(self.settings.channels, self.name)
        return cfg

    def missing(self) -> list[str]:
        """The environment variables still to set before the channel is on."""
        prefix = f"NANOFLEET_CHANNELS__{self.name.upper()}__"
        return [prefix + f.upper() for f in self.required if getattr(self.config, f, None) in (None, "")]

    def enabled(self) -> bool:
        return not self.missing()

    def chat_id_problem(self, chat_id: str) -> str | None:
        return None

    def allowed(self, sender_id: str) -> bool:
        allow = self.config.allow_from
        return "*" in allow or sender_id in allow

    def format(self, markdown: str) -> str:
        """Markdown as the platform renders it (plain text unless a platform says otherwise)."""
        return plain_text(markdown)

    def measure(self, text: str) -> int:
        """The length of `text` as the platform counts it against max_chars (characters unless a
        platform says otherwise)."""
        return len(text)

    def chunks(self, text: str) -> list[str]:
        return format_chunks(text, self.max_chars, self.format, measure=self.measure)

    def rate_limits(self, chat_id: str) -> list[Bucket]:
        return []

    def typing(self, chat_id: str, meta: dict[str, Any]) -> bool:
        return False

    def send_file(self, chat_id: str, file: OutFile, meta: dict[str, Any]) -> SendResult:
        raise Rejected(f"{self.name}: files are not sent to this platform")

    def fetch_media(self, media: dict[str, str], limit: int) -> tuple[bytes, str]:
        raise Rejected(f"{self.name}: attachments are not fetched from this platform")

    def secret(self, field_name: str) -> str:
        """A configured secret's value ("" when unset)."""
        value = getattr(self.config, field_name, None)
        return value.get_secret_value() if value is not None else ""


def default_chunks(text: str, limit: int) -> list[str]:
    """Split at paragraph, then line, then sentence, then hard boundaries."""
    out: list[str] = []
    rest = text
    while len(rest) > limit:
        cut = -1
        for sep in ("\n\n", "\n", ". ", " "):
            cut = rest.rfind(sep, 0, limit)
            if cut > 0:
                cut += len(sep)
                break
        if cut <= 0:
            cut = limit
        out.append(rest[:cut])
        rest = rest[cut:]
    if rest:
        out.append(rest)
    return out


class ChannelFactory(Protocol):
    def __call__(self, settings: Settings) -> Channel: ...
