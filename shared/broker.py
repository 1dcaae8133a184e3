"""The Redis broker transport nanofleet's Celery apps use: kombu's, with one fix.

When the broker goes away while a worker holds unacknowledged messages, Celery closes the old
connection, and kombu's channel close tries to put those messages back through a client it
builds from the connection, which is already detached: an AttributeError, which Celery treats as
unrecoverable, so the worker exits instead of reconnecting. Here that case is a connection error,
which the close ignores; the worker reconnects, and the messages are redelivered by the
visibility timeout or their runs are re-enqueued by the sweeper.

And one saving: kombu builds a new Redis client for every short command (each task's receipt and
ack, each of its monitoring events), about 0.1 ms each, five times a task. A client is thread-safe
and borrows a connection from the channel's pool per command, so the channel keeps one."""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

TRANSPORT = "shared.broker:Transport"
SCHEMES = ("redis", "rediss")  # other schemes (sentinel, socket) keep kombu's own transport


class Channel(kombu_redis.Channel):
    _short_client: Any = None  # see _create_client

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise RedisConnectionError("the broker connection is already closed")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]
        return params

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the event loop's own clients (BRPOP, pub/sub) stay kombu's
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        pool, client = self.pool, self._short_client
        if client is None or client.connection_pool is not pool:  # a new pool after a reconnect
            client = self._short_client = super()._create_client()  # type: ignore[no-untyped-call]
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel
