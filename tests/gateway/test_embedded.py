"""Embedded Redis and Postgres: real servers start, persist across restarts, stop cleanly, and let
in only who has the password (in the URL they hand out) made from the data dir's 0600 secret."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import psycopg
import pytest
import redis
from alembic.script import ScriptDirectory

from gateway import embedded
from gateway.embedded import EmbeddedService, port_open, start_postgres, start_redis
from shared.migrate import MIGRATIONS, head, upgrade
from tests.support.legacy_postgres import trust_cluster


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
        assert service.url.startswith("redis://:") and service.url.endswith("/0")
        client = redis.Redis.from_url(service.url)
        client.set("greeting", "hello")
        assert client.get("greeting") == b"hello"
        assert client.info("memory")["maxmemory_policy"] == "noeviction"
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
        assert service.url.startswith("postgresql+psycopg://nanofleet_app:")
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
            assert conn.execute("SELECT current_user").fetchone() == ("nanofleet_app",)
        argv = psutil.Process(service.process.pid).cmdline()
        pgdata = Path(argv[argv.index("-D") + 1])  # SHOW data_directory is for superusers
        assert str(pgdata).startswith(str(shared_dir / "fallback"))
        assert (private / "postgres").resolve() == pgdata
        assert (private / "embedded.secret").exists() and not (pgdata.parent / "embedded.secret").exists()
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


def _raw_redis(port: int, command: bytes) -> bytes:
    """What Redis answers a client that says `command` and nothing else (no AUTH, no HELLO)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(command + b"\r\n")
        return sock.recv(200)


def _cmdlines(pid: int) -> bytes:
    """The command lines of `pid` and its children, as every user on the host may read them (a child
    that ended since it was listed, such as a Postgres backend, has none)."""
    root = psutil.Process(pid)
    return b"\n".join(_cmdline(p.pid) for p in [root, *root.children(recursive=True)])


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def test_redis_answers_only_with_the_password_and_not_to_config(tmp_path: Path) -> None:
    """The review's attack: from 127.0.0.1, without a password, CONFIG SET dir + SAVE wrote files as
    the user running `up`. Now nothing is answered without the password, and CONFIG, DEBUG, MODULE,
    ACL and REPLICAOF are unknown even with it."""
    service = start_redis(tmp_path)
    try:
        port, secret = _port(service), urlsplit(service.url).password
        assert secret and _raw_redis(port, b"SET stolen 1").startswith(b"-NOAUTH"), "Redis answered without a password"
        assert _raw_redis(port, b"CONFIG SET dir /tmp").startswith(b"-ERR unknown command")  # before NOAUTH
        with redis.Redis.from_url(service.url) as client:
            for command in ("CONFIG SET dir /tmp", "CONFIG GET requirepass", "DEBUG SLEEP 0", "MODULE LIST",
                            "ACL SETUSER default nopass", "REPLICAOF 127.0.0.1 1", "SLAVEOF NO ONE"):
                with pytest.raises(redis.ResponseError, match="unknown command"):
                    client.execute_command(*command.split())
            assert client.ping()
        assert secret.encode() not in _cmdlines(service.process.pid)
        assert stat.S_IMODE((tmp_path / "redis" / "redis.conf").stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "redis").stat().st_mode) == 0o700  # the AOF: every queued task
        assert stat.S_IMODE((tmp_path / "redis.log").stat().st_mode) == 0o600
    finally:
        _assert_stopped(service)


def test_postgres_answers_only_with_a_password_and_not_as_a_superuser(shared_dir: Path) -> None:
    """The review's attack: from 127.0.0.1, superuser `nanofleet` without a password, and COPY ... TO
    PROGRAM ran commands as the server's user. The app's role is no superuser."""
    service = start_postgres(shared_dir)
    try:
        for role in ("nanofleet", "nanofleet_app", "postgres"):
            with pytest.raises(psycopg.OperationalError, match="no password supplied"):
                psycopg.connect(f"host=127.0.0.1 port={_port(service)} user={role} dbname=nanofleet").close()
        with psycopg.connect(_pg_url(service)) as conn:
            assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (False,)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")
        secret = urlsplit(service.url).password
        assert secret and secret.encode() not in _cmdlines(service.process.pid)
        assert stat.S_IMODE((shared_dir / "postgres.log").stat().st_mode) == 0o600  # quotes refused statements
    finally:
        _assert_stopped(service)
    assert "trust" not in _rules(shared_dir)


def _rules(data_dir: Path) -> str:
    """pg_hba.conf without its comments."""
    hba = (data_dir / "postgres" / "pg_hba.conf").read_text()
    return "\n".join(line for line in hba.splitlines() if not line.lstrip().startswith("#"))


def test_the_secret_is_the_users_alone_and_a_new_one_takes_over(shared_dir: Path) -> None:
    first = start_postgres(shared_dir)
    first.stop()
    secret = shared_dir / "embedded.secret"
    st = secret.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert str(urlsplit(first.url).password) not in secret.read_text(), "the secret is not a password itself"
    if os.geteuid() == 0 and shutil.which("setpriv"):  # where exec's commands run as `nobody`
        nobody = pwd.getpwnam("nobody")
        cat = subprocess.run(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
                              "cat", str(secret)], capture_output=True, check=False)
        assert cat.returncode != 0 and not cat.stdout, "nobody reads the secret"
    secret.chmod(0o644)
    for start in (start_redis, start_postgres):
        with pytest.raises(RuntimeError, match=r"embedded\.secret must be a file .* mode 0600.*delete it"):
            start(shared_dir)
    secret.unlink()  # as the message says: the next start makes new passwords, the data stays
    again = start_postgres(shared_dir)
    try:
        assert urlsplit(again.url).password != urlsplit(first.url).password
        with psycopg.connect(_pg_url(again)) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("nanofleet_app",)
    finally:
        _assert_stopped(again)


def _previous_revision() -> str:
    revision = ScriptDirectory(str(MIGRATIONS)).get_revision(head())
    assert revision is not None and isinstance(revision.down_revision, str)
    return revision.down_revision


def test_a_trust_cluster_of_an_older_nanofleet_asks_for_passwords_and_keeps_its_data(shared_dir: Path) -> None:
    """An upgrade: the data dir of an older nanofleet, whose superuser made the tables, migrated one
    revision short of this code's. The start makes it ask for passwords; the data stays, and the
    app's role, now their owner, applies the last migration."""
    with trust_cluster(shared_dir) as old_url:
        upgrade(old_url, _previous_revision())
        with psycopg.connect(old_url.replace("+psycopg", "", 1), autocommit=True) as conn:
            conn.execute("CREATE TABLE notes (id serial PRIMARY KEY, body text)")
            conn.execute("INSERT INTO notes (body) VALUES ('remember me')")
    assert " trust" in _rules(shared_dir)
    service = start_postgres(shared_dir)
    try:
        with pytest.raises(psycopg.OperationalError, match="no password supplied"):
            psycopg.connect(f"host=127.0.0.1 port={_port(service)} user=nanofleet dbname=nanofleet").close()
        upgrade(service.url)  # the last migration: DDL on tables the superuser made
        with psycopg.connect(_pg_url(service)) as conn:
            conn.execute("INSERT INTO notes (body) VALUES ('and me')")
            assert conn.execute("SELECT body FROM notes ORDER BY id").fetchall() == [("remember me",), ("and me",)]
            assert conn.execute("SELECT nextval('message_seq')").fetchone()
            owners = conn.execute("SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'").fetchall()
            assert owners == [("nanofleet_app",)]
    finally:
        _assert_stopped(service)
    assert "trust" not in _rules(shared_dir)
