"""The Redis broker transport nanofleet's Celery apps use: kombu's, with one fix.

When the broker goes away while a worker holds unacknowledged messages, Celery closes the old
connection, and kombu's channel close tries to put those messages back through a client it
builds from the connection, which is already detached: an AttributeError, which Celery treats as
unrecoverable, so the worker exits instead of reconnecting. Here that case is a connection error,
which the close ignores; the worker reconnects, and the messages are redelivered by the
visibility timeout or their runs are re-enqueued by the sweeper."""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

TRANSPORT = "shared.broker:Transport"
SCHEMES = ("redis", "rediss")  # other schemes (sentinel, socket) keep kombu's own transport


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise RedisConnectionError("the broker connection is already closed")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]
        return params


class Transport(kombu_redis.Transport):
    Channel = Channel
