"""Embedded Redis and Postgres: real servers start, persist across restarts, and stop cleanly."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from gateway import embedded
from gateway.embedded import EmbeddedService, port_open, start_postgres, start_redis


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A dir under /tmp that a postgres system user can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="nanofleet-embedded-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _port(service: EmbeddedService) -> int:
    return int(service.url.rsplit(":", 1)[1].split("/")[0])


def _assert_stopped(service: EmbeddedService) -> None:
    service.stop()
    assert service.process.returncode is not None
    assert not psutil.pid_exists(service.process.pid)
    assert not port_open("127.0.0.1", _port(service))


def _pg_url(service: EmbeddedService) -> str:
    return service.url.replace("postgresql+psycopg://", "postgresql://", 1)


def test_port_open() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port_open("127.0.0.1", port)
    assert not port_open("127.0.0.1", port)


def test_redis_round_trip_and_aof_persistence(tmp_path: Path) -> None:
    service = start_redis(tmp_path)
    try:
        assert service.url.startswith("redis://127.0.0.1:") and service.url.endswith("/0")
        client = redis.Redis.from_url(service.url)
        client.set("greeting", "hello")
        assert client.get("greeting") == b"hello"
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        client.close()
    finally:
        _assert_stopped(service)
    assert (tmp_path / "redis" / "appendonly.aof").stat().st_size > 0
    assert (tmp_path / "redis.log").exists()

    again = start_redis(tmp_path)
    try:
        assert redis.Redis.from_url(again.url).get("greeting") == b"hello"
    finally:
        _assert_stopped(again)
    again.stop()  # idempotent


def test_postgres_round_trip_and_persistence(shared_dir: Path) -> None:
    service = start_postgres(shared_dir)
    try:
        assert service.url.startswith("postgresql+psycopg://nanofleet@127.0.0.1:")
        assert service.url.endswith("/nanofleet")
        with psycopg.connect(_pg_url(service), autocommit=True) as conn:
            conn.execute("CREATE TABLE notes (body text)")
            conn.execute("INSERT INTO notes VALUES ('remember me')")
            assert conn.execute("SELECT body FROM notes").fetchone() == ("remember me",)
    finally:
        _assert_stopped(service)
    assert (shared_dir / "postgres" / "PG_VERSION").exists()

    again = start_postgres(shared_dir)
    try:
        with psycopg.connect(_pg_url(again)) as conn:
            assert conn.execute("SELECT body FROM notes").fetchone() == ("remember me",)
    finally:
        _assert_stopped(again)


@pytest.mark.skipif(os.geteuid() != 0, reason="the fallback only applies when running as root")
def test_postgres_as_root_falls_back_when_data_dir_unreachable(
    tmp_path: Path, shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setattr(embedded, "FALLBACK_ROOT", shared_dir / "fallback")
    service = start_postgres(private)
    try:
        with psycopg.connect(_pg_url(service)) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
            user = conn.execute("SELECT current_user").fetchone()
        assert row is not None and row[0].startswith(str(shared_dir / "fallback"))
        assert user == ("nanofleet",)
        assert (private / "postgres").resolve() == Path(row[0])
        assert psutil.Process(service.process.pid).username() != "root"
    finally:
        _assert_stopped(service)


@pytest.mark.parametrize("start", [start_redis, start_postgres], ids=["redis", "postgres"])
def test_server_that_cannot_start_raises_with_log(
    start: Callable[[Path], EmbeddedService], shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(embedded, "_pick_port", lambda preferred: taken.getsockname()[1])
        with pytest.raises(RuntimeError, match=r"exited with code \d+; see .*\.log"):
            start(shared_dir)


@pytest.mark.parametrize("start", [start_redis, start_postgres], ids=["redis", "postgres"])
def test_leftover_server_on_same_data_dir_is_replaced(
    start: Callable[[Path], EmbeddedService], shared_dir: Path
) -> None:
    leftover = start(shared_dir)  # as if `up` had been killed without stopping it
    try:
        fresh = start(shared_dir)
        try:
            assert leftover.process.wait(30) is not None
            assert not port_open("127.0.0.1", _port(leftover))
            assert port_open("127.0.0.1", _port(fresh))
        finally:
            _assert_stopped(fresh)
    finally:
        leftover.stop()


def test_postgres_gets_none_of_ups_secrets(shared_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis and PostgreSQL stay dumpable: `up`'s environment, handed down whole, was readable in
    theirs by an exec command of their user (security review). Postgres keeps its environ."""
    monkeypatch.setenv("NANOFLEET_LLM__API_KEY", "sk-canary-of-up")
    service = start_postgres(shared_dir)
    try:
        environ = Path(f"/proc/{service.process.pid}/environ").read_bytes().split(b"\0")
    finally:
        _assert_stopped(service)
    assert not any(b"canary" in v for v in environ) and any(v.startswith(b"PATH=") for v in environ)
