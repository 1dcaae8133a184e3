"""Chat platforms: one module each, registered here by name."""

from __future__ import annotations

from shared.channels.base import Channel, ChannelFactory
from shared.channels.discord import DiscordChannel
from shared.channels.feishu import FeishuChannel
from shared.channels.slack import SlackChannel
from shared.channels.telegram import TelegramChannel
from shared.channels.webhook import WebhookChannel
from shared.channels.whatsapp import WhatsAppChannel
from shared.settings import Settings

REGISTRY: dict[str, ChannelFactory] = {
    "telegram": TelegramChannel,
    "slack": SlackChannel,
    "whatsapp": WhatsAppChannel,
    "feishu": FeishuChannel,
    "discord": DiscordChannel,
    "webhook": WebhookChannel,
}


def get_channel(name: str, settings: Settings) -> Channel | None:
    factory = REGISTRY.get(name)
    return factory(settings) if factory else None
