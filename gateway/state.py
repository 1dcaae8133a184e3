"""What the gateway process holds: settings, runtime, producer, Redis clients."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis
from kombu.exceptions import OperationalError

from shared.agent.events import RedisEvents
from shared.agent.runtime import Next, Runtime
from shared.channels.base import Channel
from shared.queueing import Producer, make_celery
from shared.scheduling import hooks
from shared.settings import Settings

log = logging.getLogger(__name__)
# Each open event stream holds an async connection while it waits for events (a blocking read of up
# to 15 s), so the streams served at once are capped below the pool's size: past MAX_STREAMS a new
# one gets a 503, and the rest of the pool stays for /chat and the streams' first commands. When even
# that is in use, a command waits REDIS_WAIT seconds for a free connection and then fails, which
# gateway/app.py answers with a 503 (a pool that refused at once would be a 500).
MAX_STREAMS = 200
REDIS_CONNECTIONS = MAX_STREAMS + 50
REDIS_WAIT = 5.0
# Longer than the longest blocking read (the streams' 15 s XREAD): redis-py's default of 5 s would cut
# every read of an idle stream, and with it the stream, short. Connecting keeps the 5 s.
REDIS_READ_TIMEOUT = 30.0
REDIS_CONNECT_TIMEOUT = 5.0


def async_redis(url: str, *, connections: int = REDIS_CONNECTIONS, wait: float = REDIS_WAIT) -> aioredis.Redis:
    """A client whose commands wait up to `wait` seconds for one of `connections` to come free;
    then redis.ConnectionError (from a TimeoutError)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=connections, timeout=wait, decode_responses=True,
        socket_timeout=REDIS_READ_TIMEOUT, socket_connect_timeout=REDIS_CONNECT_TIMEOUT,
    )
    return aioredis.Redis.from_pool(pool)


@dataclass
class AppState:
    """What one gateway process shares between requests."""

    settings: Settings
    runtime: Runtime
    producer: Producer
    redis: redis.Redis
    aredis: aioredis.Redis
    channels: dict[str, Channel] = field(default_factory=dict)  # platform instances, built on first use
    max_streams: int = MAX_STREAMS
    streams: int = 0  # event streams open now (one event loop: a plain counter)

    @classmethod
    def build(cls, settings: Settings) -> AppState:
        client = redis.Redis.from_url(settings.redis_url, max_connections=100)
        return cls(
            settings=settings,
            runtime=hooks.install(Runtime.build(settings, events=RedisEvents(client))),  # a cancel ends runs too
            producer=Producer(make_celery(settings, name="nanofleet-gateway")),
            redis=client,
            aredis=async_redis(settings.redis_url),
        )

    def dispatch(self, nexts: list[Next]) -> None:
        """Enqueue what a committed request asks for. Its state is in Postgres already, so a broker
        that is down fails nothing: the sweeper enqueues queued runs, pending sends and due /new
        summaries once it is back."""
        for i, nxt in enumerate(nexts):
            try:
                self.producer.send(nxt.task, *nxt.args, countdown=nxt.countdown)
            except OperationalError as err:
                log.warning("could not enqueue %d task(s) (%s); the sweeper will once the broker answers",
                            len(nexts) - i, err)
                return
