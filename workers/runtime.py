"""The worker process's runtime (built once) and dispatch of the tasks a step asks for."""

from __future__ import annotations

from functools import lru_cache

import redis
from celery import current_app

from shared.agent.events import RedisEvents
from shared.agent.runtime import Next, Runtime
from shared.queueing import Producer
from shared.settings import get_settings


@lru_cache(maxsize=1)
def runtime() -> Runtime:
    settings = get_settings()
    client = redis.Redis.from_url(settings.redis_url, max_connections=100, health_check_interval=30)
    rt = Runtime.build(settings, events=RedisEvents(client))
    rt.send_now = dispatch
    from workers.hooks import install

    install(rt)
    return rt


def dispatch(nexts: list[Next]) -> None:
    """Enqueue the next tasks (after the step committed its state)."""
    producer = Producer(current_app)
    for nxt in nexts:
        producer.send(nxt.task, *nxt.args, countdown=nxt.countdown)
