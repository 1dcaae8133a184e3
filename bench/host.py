"""How fast this host does the small things a turn is made of: a round trip to Redis and to Postgres,
waking another thread, and plain Python. A turn's overhead is mostly these, dozens of times over, and
the shared hosts the bench runs on differ in them far more than in raw CPU speed; printed beside the
overhead figures so runs on different days can be compared."""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Callable

import redis
from sqlalchemy import Engine, text

SAMPLES = 500


def _median_us(op: Callable[[], object], n: int = SAMPLES) -> float:
    for _ in range(n // 10):  # warm up: connections, caches
        op()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        op()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _thread_wakeup_us() -> float:
    """A round trip to another thread through two queues (what a task handed to a pool thread pays)."""
    there: queue.Queue[int | None] = queue.Queue()
    back: queue.Queue[int] = queue.Queue()

    def echo() -> None:
        while (item := there.get()) is not None:
            back.put(item)

    peer = threading.Thread(target=echo, daemon=True)
    peer.start()

    def trip() -> int:
        there.put(1)
        return back.get()

    try:
        return _median_us(trip)
    finally:
        there.put(None)
        peer.join(5)


def _python_ms() -> float:
    """A million iterations of a small pure-Python loop: the host's speed at plain interpretation."""
    start = time.perf_counter()
    total = 0
    for i in range(1_000_000):
        total += i & 7
    return (time.perf_counter() - start) * 1000


def probe(redis_url: str, engine: Engine) -> dict[str, str]:
    """Median round trips (µs) and the Python loop (ms), as table cells by what was measured."""
    client = redis.Redis.from_url(redis_url)
    try:
        redis_us = _median_us(client.ping)
    finally:
        client.close()
    with engine.connect() as conn:
        pg_us = _median_us(lambda: conn.execute(text("select 1")).scalar())
    return {
        "Redis PING round trip": f"{redis_us:.0f} µs",
        "Postgres `select 1` round trip (SQLAlchemy)": f"{pg_us:.0f} µs",
        "wake another thread and back": f"{_thread_wakeup_us():.0f} µs",
        "1M iterations of a Python loop": f"{_python_ms():.0f} ms",
    }

