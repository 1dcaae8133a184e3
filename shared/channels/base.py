"""The channel contract: one module per platform verifies and parses inbound webhooks and
formats, chunks and sends outbound messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from shared.contracts import InboundMessage
from shared.settings import Settings


class WebhookError(Exception):
    """A webhook the gateway must refuse: 401 for a bad signature, 400 for a malformed body."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


@dataclass
class Parsed:
    """What a verified webhook contained: messages to process and/or an immediate answer."""

    messages: list[InboundMessage] = field(default_factory=list)
    response: dict[str, Any] | None = None  # e.g. a url_verification challenge or a Discord PONG
    event_id: str | None = None  # for the ledger when the event carries no message


@dataclass
class SendResult:
    platform_message_id: str | None = None


class RateLimited(Exception):
    """The platform said 429; try again after `retry_after` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate limited, retry after {retry_after}s")
        self.retry_after = retry_after


class Channel(Protocol):
    """A chat platform."""

    name: ClassVar[str]
    max_chars: ClassVar[int]

    def enabled(self) -> bool: ...

    def verify(self, headers: dict[str, str], body: bytes) -> None:
        """Raise WebhookError(401) unless the request is signed by the platform."""

    def parse(self, headers: dict[str, str], body: bytes) -> Parsed:
        """Raise WebhookError(400) on a malformed body; unknown events give an empty Parsed."""

    def chunks(self, text: str) -> list[str]:
        """The text formatted for the platform and split under its limit."""

    def send(self, chat_id: str, text: str, meta: dict[str, Any]) -> SendResult:
        """Deliver one chunk; raise RateLimited on 429, other exceptions to retry."""


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
