"""`nanofleet status`: database, Redis, workers alive, queue depths."""

from __future__ import annotations

from collections.abc import Callable

import redis

from shared.constants import QUEUES
from shared.db import ping as db_ping
from shared.migrate import current
from shared.queueing import make_celery
from shared.settings import Settings


def report(settings: Settings, echo: Callable[[str], None]) -> bool:
    ok = True
    try:
        db_ping(settings.database_url)
        echo(f"database   ok (revision {current(settings.database_url) or 'none: run nanofleet migrate'})")
    except Exception as err:
        ok = False
        echo(f"database   DOWN: {type(err).__name__}: {str(err).splitlines()[0]}")
    try:
        client = redis.Redis.from_url(settings.redis_url, socket_timeout=2)
        client.ping()
        echo("redis      ok")
    except Exception as err:
        echo(f"redis      DOWN: {type(err).__name__}")
        return False
    replies = make_celery(settings).control.ping(timeout=1.0) or []
    names = sorted(name for reply in replies for name in reply)
    echo(f"workers    {len(names)} alive" + (f": {', '.join(names)}" if names else ""))
    ok = ok and bool(names)
    for queue in QUEUES:
        echo(f"queue      {queue:<10} {client.llen(queue)} waiting")
    return ok
