"""`nanofleet status`, and the checks commands make before they use Postgres or Redis or listen on
a port: each problem is one line naming the service, its URL (password masked), the reason and the
setting to fix."""

from __future__ import annotations

import errno
import re
import socket
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from shared.constants import QUEUES
from shared.settings import Settings

CONNECT_TIMEOUT = 3  # seconds: a server that has not answered by then is reported, not waited for
DB_SETTING, REDIS_SETTING = "NANOFLEET_DATABASE_URL", "NANOFLEET_REDIS_URL"
_REDIS_PREFIX = re.compile(r"^Error -?\d+ connecting to \S+\. ")  # "Error 111 connecting to h:p. Connection refused."


class Unavailable(Exception):
    """Something a command needs is missing, down or taken; the message says what and what to do."""


class ServiceDown(Unavailable):
    """Postgres or Redis does not answer or refuses us."""

    def __init__(self, service: str, url: str, reason: str, setting: str) -> None:
        super().__init__(f"{service} at {masked(url)}: {reason} (check {setting})")
        self.service, self.url, self.reason, self.setting = service, masked(url), reason, setting


# A password given as a query parameter (libpq's `password` and `sslpassword`, redis-py's `password`)
_SECRET_PARAM = re.compile(r"(?i)((?:^|&)(?:ssl)?password=)[^&]*")


def masked(url: str) -> str:
    """`url` with its passwords, if any (in the user info or the query), shown as ***."""
    parts = urlsplit(url)
    if parts.password is not None:
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{parts.netloc.rpartition('@')[2]}")
    return urlunsplit(parts._replace(query=_SECRET_PARAM.sub(r"\1***", parts.query)))


def _pg_reason(err: DBAPIError) -> str:
    """libpq's reason without its preamble: 'Connection refused', 'role "x" does not exist', ..."""
    lines = str(err.orig).strip().splitlines() or [type(err.orig).__name__]
    _, found, tail = lines[0].rpartition(" failed: ")
    return (tail if found else lines[0]).removeprefix("FATAL:").strip()


def database_problem(url: str, *, may_create: bool = False) -> str | None:
    """Why the database at `url` cannot be used, or None. With `may_create`, a missing database
    is fine when the server answers (migrations create it)."""
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": CONNECT_TIMEOUT})
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
        return None
    except DBAPIError as err:
        reason = _pg_reason(err)
    finally:
        engine.dispose()
    if re.fullmatch(r'database ".*" does not exist', reason):
        if may_create:
            return database_problem(make_url(url).set(database="postgres").render_as_string(hide_password=False))
        return f"{reason}; `nanofleet migrate` creates it"
    return reason


def redis_problem(url: str) -> str | None:
    """Why Redis at `url` cannot be used, or None."""
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=CONNECT_TIMEOUT,
                                  retry=Retry(NoBackoff(), 0)) as client:
            client.ping()
        return None
    except redis.RedisError as err:
        return _REDIS_PREFIX.sub("", str(err)).rstrip(".") or type(err).__name__


def require_database(url: str, *, may_create: bool = False) -> None:
    """Raise ServiceDown unless the database at `url` answers."""
    if (reason := database_problem(url, may_create=may_create)) is not None:
        raise ServiceDown("PostgreSQL", url, reason, DB_SETTING)


def require_redis(url: str) -> None:
    """Raise ServiceDown unless Redis at `url` answers."""
    if (reason := redis_problem(url)) is not None:
        raise ServiceDown("Redis", url, reason, REDIS_SETTING)


def port_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on host:port, or None (bound as uvicorn binds, then let go)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free
            sock.bind(address)
        return None
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return f"port {port} on {host} is in use"
        return f"cannot listen on {host}:{port}: {err.strerror or err}"


def report(settings: Settings, echo: Callable[[str], None]) -> bool:
    """Print the database, Redis, live workers and queue depths; True when all is well."""
    from shared.migrate import current
    from shared.queueing import make_celery

    ok = True
    if (problem := database_problem(settings.database_url)) is None:
        try:
            echo(f"database   ok (revision {current(settings.database_url) or 'none: run nanofleet migrate'})")
        except Exception as err:
            ok = False
            echo(f"database   DOWN: {type(err).__name__}: {str(err).splitlines()[0]}")
    else:
        ok = False
        echo(f"database   DOWN: {masked(settings.database_url)}: {problem} (check {DB_SETTING})")
    if (problem := redis_problem(settings.redis_url)) is not None:
        echo(f"redis      DOWN: {masked(settings.redis_url)}: {problem} (check {REDIS_SETTING})")
        return False
    echo("redis      ok")
    replies = make_celery(settings).control.ping(timeout=1.0) or []
    names = sorted(name for reply in replies for name in reply)
    echo(f"workers    {len(names)} alive" + (f": {', '.join(names)}" if names else ""))
    ok = ok and bool(names)
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=2)
    for queue in QUEUES:
        echo(f"queue      {queue:<10} {client.llen(queue)} waiting")
    client.close()
    return ok
