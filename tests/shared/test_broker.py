"""The broker transport (shared/broker.py) on a real Redis: one client per channel for short
commands, following the channel's pool when it is rebuilt, and messages still go through."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import redis
from kombu import Connection

from shared import broker


def test_a_channel_reuses_one_client_and_follows_a_new_pool(redis_server: str, redis_dbs: tuple[int, int]) -> None:
    with Connection(f"{redis_server}/{redis_dbs[1]}", transport=broker.TRANSPORT) as conn:
        channel = conn.default_channel
        first = channel._create_client()
        assert channel._create_client() is first
        assert first.connection_pool is channel.pool

        channel._disconnect_pools()  # what a reconnect does
        second = channel._create_client()
        assert second is not first and second.connection_pool is channel.pool
        assert channel._create_client(asynchronous=True) is not second  # the event loop's own


def test_acks_from_many_threads_share_the_client(redis_server: str, redis_dbs: tuple[int, int]) -> None:
    """A threads pool acknowledges each task from the thread that ran it, all on one channel."""
    url, keys = f"{redis_server}/{redis_dbs[1]}", f"nanofleet-test-{uuid.uuid4().hex[:8]}"
    options = {"unacked_key": f"{keys}:unacked", "unacked_index_key": f"{keys}:unacked_index"}  # this test's own
    with Connection(url, transport=broker.TRANSPORT, transport_options=options) as conn:
        queue = conn.SimpleQueue(keys)
        for i in range(200):
            queue.put({"n": i})
        messages = [queue.get(timeout=5) for _ in range(200)]
        assert sorted(m.payload["n"] for m in messages) == list(range(200))
        unacked = redis.Redis.from_url(url)
        assert unacked.hlen(f"{keys}:unacked") == 200

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda m: m.ack(), messages))
        assert unacked.hlen(f"{keys}:unacked") == 0 and unacked.zcard(f"{keys}:unacked_index") == 0
        assert unacked.llen(keys) == 0
        queue.close()
