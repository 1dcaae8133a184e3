"""Chat platforms: one module each, registered here by name."""

from __future__ import annotations

from shared.channels.base import Channel, ChannelFactory
from shared.settings import Settings

REGISTRY: dict[str, ChannelFactory] = {}


def get_channel(name: str, settings: Settings) -> Channel | None:
    factory = REGISTRY.get(name)
    return factory(settings) if factory else None
