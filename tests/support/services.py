"""Where the tests find Postgres and Redis: NANOFLEET_TEST_* URLs, else local servers, else
testcontainers when a Docker engine answers, else a message saying what to do."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import redis

HOW = (
    "Integration tests need PostgreSQL and Redis. Either set NANOFLEET_TEST_DATABASE_URL "
    "(postgresql+psycopg://user@host:5432/db) and NANOFLEET_TEST_REDIS_URL (redis://host:6379), "
    "or run them locally on 127.0.0.1:5432 (trust auth for user postgres) and 127.0.0.1:6379 "
    "(`bash .ci/run` installs and starts both on Debian), or start a Docker engine for testcontainers."
)
_containers: list[object] = []


def _open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _docker() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:
        return False


def _resolve(env: str, port: int, local: str, container: Callable[[], str]) -> str:
    if os.environ.get(env):
        return os.environ[env]
    if _open(port):
        return local
    if _docker():
        return container()
    pytest.exit(HOW, returncode=3)


def _pg_container() -> str:
    from testcontainers.postgres import PostgresContainer

    c = PostgresContainer("postgres:15-alpine", driver="psycopg").start()
    _containers.append(c)
    return str(c.get_connection_url())


def _redis_container() -> str:
    from testcontainers.redis import RedisContainer

    c = RedisContainer("redis:7-alpine").start()
    _containers.append(c)
    return f"redis://{c.get_container_host_ip()}:{c.get_exposed_port(6379)}"


def postgres_url() -> str:
    return _resolve("NANOFLEET_TEST_DATABASE_URL", 5432, "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
                    _pg_container)


def redis_base_url() -> str:
    """A server URL without a database number."""
    url = _resolve("NANOFLEET_TEST_REDIS_URL", 6379, "redis://127.0.0.1:6379", _redis_container)
    return url.rstrip("/").rsplit("/", 1)[0] if url.count("/") > 2 else url


def stop_containers() -> None:
    for c in _containers:
        c.stop()  # type: ignore[attr-defined]


REDIS_DB_CLAIM = "nanofleet-test-db:"  # keys in DB 0 that reserve a database number per test session


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def claimed_redis_dbs(server: str, count: int) -> Iterator[list[int]]:
    """Reserve `count` free, flushed Redis database numbers (1-15) while the block runs, so
    concurrent test sessions and fixtures never share queues or flush each other's."""
    client = redis.Redis.from_url(f"{server}/0")
    taken: list[int] = []
    for n in range(1, 16):
        key = f"{REDIS_DB_CLAIM}{n}"
        holder = client.get(key)
        if holder is not None and not _alive(int(holder)):
            client.delete(key)  # left by a test session that was killed
        if client.set(key, os.getpid(), nx=True, ex=3 * 3600):
            taken.append(n)
            if len(taken) == count:
                break
    if len(taken) < count:
        client.delete(*[f"{REDIS_DB_CLAIM}{n}" for n in taken]) if taken else None
        pytest.exit(f"no free Redis databases 1-15 for the tests (other sessions hold the {REDIS_DB_CLAIM}* keys "
                    "in DB 0; delete them if they are stale)", returncode=3)
    for n in taken:
        redis.Redis.from_url(f"{server}/{n}").flushdb()
    try:
        yield taken
    finally:
        client.delete(*[f"{REDIS_DB_CLAIM}{n}" for n in taken])
