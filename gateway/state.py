"""What the gateway process holds: settings, runtime, producer, Redis clients, the webhook ledger's
writer, the worker count."""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis
from celery import Celery
from celery.app.control import Control
from kombu.exceptions import OperationalError

from gateway.ledger import Ledger
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
# The gateway's broker connection: a Redis that accepts and never answers fails a send in about
# 2 x BROKER_TIMEOUT (one try and one retry, which a connection gone stale with a restart needs), not
# after minutes with the request held. Its blocking reads (the workers' ping replies) wait 1 s at most.
BROKER_TIMEOUT = 2.0
WORKER_PING_TIMEOUT = 1.0
WORKERS_FRESH = 5.0  # seconds a worker count is reused


def gateway_celery(settings: Settings) -> Celery:
    """The Celery app the gateway sends tasks with: the workers' configuration, with a socket timeout
    on the broker connection and one retry of a failed send. (The workers keep no socket timeout:
    theirs is a long-lived consumer.) A send that fails leaves the sweeper to enqueue (AppState.dispatch)."""
    app = make_celery(settings, name="nanofleet-gateway")
    app.conf.broker_transport_options = {**app.conf.broker_transport_options, "socket_timeout": BROKER_TIMEOUT,
                                         "socket_connect_timeout": BROKER_TIMEOUT}
    app.conf.task_publish_retry_policy = {**app.conf.task_publish_retry_policy, "max_retries": 1}
    return app


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
    workers: WorkerCount
    channels: dict[str, Channel] = field(default_factory=dict)  # platform instances, built on first use
    max_streams: int = MAX_STREAMS
    streams: int = 0  # event streams open now (one event loop: a plain counter)
    ledger: Ledger = field(init=False)  # webhook events, recorded in batches

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.settings, self.dispatch)

    @classmethod
    def build(cls, settings: Settings) -> AppState:
        client = redis.Redis.from_url(settings.redis_url, max_connections=100)
        producer = Producer(gateway_celery(settings))
        return cls(
            settings=settings,
            runtime=hooks.install(Runtime.build(settings, events=RedisEvents(client))),  # a cancel ends runs too
            producer=producer,
            redis=client,
            aredis=async_redis(settings.redis_url),
            workers=WorkerCount(producer.app.control),
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


class WorkerCount:
    """How many workers answer a ping: asked by one request at a time, at most every WORKERS_FRESH
    seconds, the others reusing the answer. (/readyz asks it, and needs no key. A broadcast per request held a
    broker connection while it waited for another from the same pool: a burst of calls took the
    whole pool and waited forever, and the gateway answered nothing more.)"""

    def __init__(self, control: Control) -> None:
        self.control = control
        self.lock = threading.Lock()
        self.value: int | None = None
        self.asked = -math.inf

    def count(self) -> int | None:
        """None while the first answer is still awaited by another request."""
        if time.monotonic() - self.asked < WORKERS_FRESH:
            return self.value
        if not self.lock.acquire(timeout=2 * WORKER_PING_TIMEOUT):
            return self.value
        try:
            if time.monotonic() - self.asked >= WORKERS_FRESH:  # unless a request just asked
                self.value = len(self.control.ping(timeout=WORKER_PING_TIMEOUT) or [])
                self.asked = time.monotonic()
            return self.value
        finally:
            self.lock.release()
