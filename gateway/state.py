"""What the gateway process holds: settings, runtime, producer, Redis clients."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis

from shared.agent.events import RedisEvents
from shared.agent.runtime import Next, Runtime
from shared.channels.base import Channel
from shared.queueing import Producer, make_celery
from shared.settings import Settings


@dataclass
class AppState:
    settings: Settings
    runtime: Runtime
    producer: Producer
    redis: redis.Redis
    aredis: aioredis.Redis
    channels: dict[str, Channel] = field(default_factory=dict)  # platform instances, built on first use

    @classmethod
    def build(cls, settings: Settings) -> AppState:
        client = redis.Redis.from_url(settings.redis_url, max_connections=100)
        return cls(
            settings=settings,
            runtime=Runtime.build(settings, events=RedisEvents(client)),
            producer=Producer(make_celery(settings, name="nanofleet-gateway")),
            redis=client,
            aredis=aioredis.Redis.from_url(settings.redis_url, max_connections=200, decode_responses=True),
        )

    def dispatch(self, nexts: list[Next]) -> None:
        for nxt in nexts:
            self.producer.send(nxt.task, *nxt.args, countdown=nxt.countdown)
