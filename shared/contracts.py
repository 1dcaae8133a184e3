"""Small JSON models that travel between the gateway, the queue and the workers."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class InboundMessage(BaseModel):
    """A message from a user on some channel, normalised by the channel module."""

    channel: str
    chat_id: str
    sender_id: str
    content: str
    event_id: str
    session_key: str = ""  # defaults to "<channel>:<chat_id>"; Slack threads use their own
    reply_meta: dict[str, Any] = Field(default_factory=dict)  # what a reply needs (thread ts...)
    sender_name: str | None = None

    def key(self) -> str:
        return self.session_key or f"{self.channel}:{self.chat_id}"


class OutboundMessage(BaseModel):
    """Text to deliver to one chat on one channel."""

    channel: str
    chat_id: str
    content: str
    meta: dict[str, Any] = Field(default_factory=dict)
