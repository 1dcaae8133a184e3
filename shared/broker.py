"""The Redis broker transport nanofleet's Celery apps use: kombu's, with one fix.

When the broker goes away while a worker holds unacknowledged messages, Celery closes the old
connection, and kombu's channel close tries to put those messages back through a client it
builds from the connection, which is already detached: an AttributeError, which Celery treats as
unrecoverable, so the worker exits instead of reconnecting. Here that case is a connection error,
which the close ignores; the worker reconnects, and the messages are redelivered by the
visibility timeout or their runs are re-enqueued by the sweeper.

And one saving: kombu builds a new Redis client for every short command (each task's receipt and
ack, each of its monitoring events), about 0.1 ms each, five times a task. A client is thread-safe
and borrows a connection from the channel's pool per command, so the channel keeps one.

A unix:// NANOFLEET_REDIS_URL gets this transport too (SocketTransport): kombu names a socket
`redis+socket://`, and that prefix picks kombu's own transport whatever Celery's broker_transport says,
so a worker on a socket exited on the first Redis restart that caught it holding messages.

Also here: the Celery settings that point the broker, the result backend and redbeat at one
NANOFLEET_REDIS_URL (redis_config), since each of the three reads a URL its own way."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.redis_urls import CERT_REQS, REDIS_TLS_PARAMS

TRANSPORT = "shared.broker:Transport"  # for redis:// and rediss://
SOCKET_TRANSPORT = "shared.broker:SocketTransport"  # for unix:// (see redis_config)


def tls_options(params: dict[str, str]) -> dict[str, Any]:
    """TLS options from a rediss:// URL's parameters (REDIS_TLS_PARAMS): the server's certificate is
    verified unless they say otherwise. They are taken off the URL and given to the broker, the result
    backend and redbeat as options: Celery's result backend refuses a rediss:// URL without
    ssl_cert_reqs, and nanofleet's transport (unlike kombu's own for rediss://) only uses TLS when told."""
    options: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    for name, value in params.items():
        if name == "ssl_cert_reqs":
            options[name] = CERT_REQS[value]  # the settings let no other word through
        elif name == "ssl_check_hostname":
            options[name] = value.strip().upper() not in ("0", "F", "FALSE", "N", "NO")  # as redis-py reads it
        else:
            options[name] = value
    return options


def redis_config(url: str) -> dict[str, Any]:
    """The Celery settings that reach Redis at `url` (redis://, rediss:// or unix://, as the settings
    accept it) for the broker, the result backend and redbeat."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if parts.scheme == "unix":
        # The broker reads socket://[:password@]/path?virtual_host=N (SocketTransport), Celery's backend
        # redis+socket:// with the same rest; redbeat (redis-py) reads unix:// itself.
        socket_url = _socket_url(parts, query)
        return {"broker_url": socket_url, "broker_transport": SOCKET_TRANSPORT,
                "result_backend": f"redis+{socket_url}", "redbeat_redis_url": url}
    plain = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k not in REDIS_TLS_PARAMS])))
    config: dict[str, Any] = {"broker_url": plain, "broker_transport": TRANSPORT, "result_backend": plain,
                              "redbeat_redis_url": plain}
    if parts.scheme == "rediss":
        tls = tls_options({k: v for k, v in query if k in REDIS_TLS_PARAMS})
        config |= {"broker_use_ssl": tls, "redis_backend_use_ssl": tls, "redbeat_redis_use_ssl": tls}
    return config


def kombu_config(url: str) -> dict[str, Any]:
    """The broker settings for kombu's own Redis transport, for a reader of the broker URL (Flower's
    broker view knows redis://, rediss:// and redis+socket://, not nanofleet's transports)."""
    return {"broker_url": redis_config(url)["result_backend"], "broker_transport": None}  # the same URL


def _socket_url(parts: SplitResult, query: list[tuple[str, str]]) -> str:
    """socket://[:password@]/path?virtual_host=N: kombu's socket form without its redis+ prefix."""
    auth, _, _ = parts.netloc.rpartition("@")
    db = [("virtual_host", value) for name, value in query if name == "db"]
    socket_url = f"socket://{auth}@{parts.path}" if auth else f"socket://{parts.path}"
    return socket_url + (f"?{urlencode(db)}" if db else "")


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


class SocketTransport(Transport):
    """The transport for a unix socket, given socket://[:password@]/path?virtual_host=N. kombu hands
    the socket:// URL whole to the channel (which reads the socket, password and database from it)
    only when redis+socket:// named its own transport; here the transport says it reads the URL
    itself, which the channel does, in kombu's code."""

    can_parse_url = True
