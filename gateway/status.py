"""`nanofleet status`, and the checks commands make before they use Postgres or Redis or listen on
a port: each problem is one line naming the service, its URL (password masked), the reason and the
setting to fix."""

from __future__ import annotations

import errno
import logging
import re
import socket
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from shared.constants import BEAT_LOCK, QUEUES
from shared.db import NO_DATABASE, connect_args
from shared.settings import Settings, SettingsError

NOT_TAKEN = "  NO WORKER TAKES IT (start one with --queues naming it)"
NO_BEAT = "runs stuck by a dead worker are not recovered, cron does not fire (start `nanofleet beat`, exactly one)"
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


def _engine(url: str) -> Engine:
    options = {**connect_args(url), "connect_timeout": CONNECT_TIMEOUT}  # a URL's own application_name is kept
    return create_engine(url, poolclass=NullPool, connect_args=options)


def database_problem(url: str, *, may_create: bool = False) -> str | None:
    """Why the database at `url` cannot be used, or None. With `may_create`, a missing database
    is fine when the server answers (migrations create it)."""
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
        return None
    except DBAPIError as err:
        reason = _pg_reason(err)
    finally:
        engine.dispose()
    if NO_DATABASE.fullmatch(reason):
        if may_create:
            return database_problem(make_url(url).set(database="postgres").render_as_string(hide_password=False))
        return f"{reason}; `nanofleet migrate` creates it"
    return reason


def migration_problem(url: str) -> str | None:
    """Why this nanofleet cannot work on the database at `url` as it is (missing, never migrated, at
    an older revision, another application's; a newer nanofleet's is served, see problem_at), in a
    line naming it and what to run; None when it is usable. One connection; None too when the server
    does not answer: a process may start before it and wait for it, and /readyz reports it meanwhile."""
    from shared.db import DatabaseRefused
    from shared.migrate import problem_at, revision_at

    engine = _engine(url)
    try:
        with engine.connect() as conn:
            problem = problem_at(conn, revision_at(conn))
    except DatabaseRefused as err:
        problem = f"refused: {err}"
    except DBAPIError as err:
        if not NO_DATABASE.fullmatch(_pg_reason(err)):
            return None
        problem = "does not exist: run `nanofleet migrate`"
    finally:
        engine.dispose()
    return None if problem is None else f"the database at {masked(url)} {problem}"


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


def _database_line(url: str) -> tuple[bool, str]:
    """`nanofleet status`'s database line, and whether all is well there."""
    from shared.migrate import problem_at, revision_at

    if (problem := database_problem(url)) is not None:
        return False, f"database   DOWN: {masked(url)}: {problem} (check {DB_SETTING})"
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            revision = revision_at(conn)
            problem = problem_at(conn, revision)
    except Exception as err:
        return False, f"database   DOWN: {type(err).__name__}: {str(err).splitlines()[0]}"
    finally:
        engine.dispose()
    if problem is not None:
        return False, f"database   NOT READY: {problem}"
    return True, f"database   ok (revision {revision})"


def _failures_line(url: str) -> str:
    """What waits for the operator: replies dead-lettered after their last retry, and inbound messages
    set aside after failing max_recoveries times (docs/channels.md)."""
    with _engine(url).connect() as conn:
        replies, aside = conn.execute(text(
            "select (select count(*) from outbox where status = 'failed'), "
            "(select count(*) from inbound_events where set_aside is not null)")).one()
    return (f"failures   {replies} repl{'y' if replies == 1 else 'ies'} dead-lettered "
            f"(GET /api/v1/outbox?status=failed), {aside} inbound message{'' if aside == 1 else 's'} "
            "set aside (inbound_events.set_aside)")


def report(settings: Settings, echo: Callable[[str], None]) -> bool:
    """Print the database, Redis, live workers, queue depths, plugins and MCP servers; True when all is well."""
    from shared.queueing import make_celery

    ok, line = _database_line(settings.database_url)
    echo(line)
    if ok:
        echo(_failures_line(settings.database_url))
    if (problem := redis_problem(settings.redis_url)) is not None:
        echo(f"redis      DOWN: {masked(settings.redis_url)}: {problem} (check {REDIS_SETTING})")
        return False
    echo("redis      ok")
    consuming = make_celery(settings).control.inspect(timeout=1.0).active_queues() or {}  # worker -> its queues
    names = sorted(consuming)
    echo(f"workers    {len(names)} alive" + (f": {', '.join(names)}" if names else ""))
    taken = {q["name"] for queues in consuming.values() for q in queues}
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=2)
    for queue in QUEUES:
        echo(f"queue      {queue:<10} {client.llen(queue)} waiting" + ("" if queue in taken else NOT_TAKEN))
    beat = bool(client.exists(BEAT_LOCK))
    client.close()
    echo("beat       ok" if beat else f"beat       NOT RUNNING: nobody holds {BEAT_LOCK}: {NO_BEAT}")
    plugins = _plugins_line(settings, echo)
    servers = _mcp_lines(settings, echo)
    return ok and bool(names) and taken.issuperset(QUEUES) and beat and plugins and servers


def _plugins_line(settings: Settings, echo: Callable[[str], None]) -> bool:
    """`nanofleet status`'s line on NANOFLEET_TOOLS__PLUGINS, when it names any (a worker whose plugins
    do not load refuses to start, and says why only in its own log); whether they all load."""
    if not settings.tools.plugins:  # before the import: the tools take seconds to import (litellm)
        return True
    from shared.tools import check_plugins

    try:
        check_plugins(settings)
    except SettingsError as err:
        echo(f"plugins    BROKEN: {err}")
        return False
    echo(f"plugins    ok ({len(settings.tools.plugins)})")
    return True


def _mcp_lines(settings: Settings, echo: Callable[[str], None]) -> bool:
    """`nanofleet status`'s line per MCP server in NANOFLEET_TOOLS__MCP_SERVERS, when it names any: up
    with its tool count, or down and why, as this process finds it, connecting to each once (all at
    once, within NANOFLEET_TOOLS__MCP_CONNECT_TIMEOUT; the workers record their own sessions' state
    only in their logs). Whether they are all up."""
    servers = settings.tools.mcp_servers
    if not servers:  # before the import: the tools and the MCP SDK take seconds to import
        return True
    if "mcp" in settings.tools.disabled_groups:
        echo(f"mcp        {len(servers)} server(s) not used: NANOFLEET_TOOLS__DISABLED_GROUPS names mcp")
        return True
    from shared.logs import RedactingFormatter
    from shared.tools import mcp
    from shared.tools.mcp.connection import State

    masked = RedactingFormatter(logging.Formatter(), settings.secrets())  # as the workers log the same errors
    found = mcp.probe(settings)
    for conn in found:
        tools = f"{len(conn.tools)} tool{'' if len(conn.tools) == 1 else 's'}"
        state = f"ok ({tools})" if conn.state == State.UP else f"DOWN: {masked.redact(conn.error)}"
        echo(f"mcp        {conn.name}: {state}")
    return all(conn.state == State.UP for conn in found)
