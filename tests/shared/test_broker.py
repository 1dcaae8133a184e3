"""The broker transport (shared/broker.py) on a real Redis: one client per channel for short
commands, following the channel's pool when it is rebuilt, and messages still go through; and the
Celery configuration each NANOFLEET_REDIS_URL form gets, on a real Redis over TLS and on a socket."""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from celery import Celery
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from kombu import Connection
from kombu.exceptions import OperationalError
from redbeat.schedulers import RedBeatConfig, get_redis

from shared import broker
from shared.queueing import make_celery
from shared.settings import load_settings
from tests.fakes.llm import FakeLLM
from tests.support.processes import start_worker, wait_until
from tests.support.stack import make_env, settings_from


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


# --------------------------------------------------------------------------- rediss:// and unix://
# What the workers build from NANOFLEET_REDIS_URL (shared.queueing.celery_config): the broker, the
# result backend and redbeat each reach Redis their own way, and each must use TLS (verified) for
# rediss:// and the socket for unix://.


SOCKET_PASSWORD = "socket-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_certs(folder: Path) -> Path:
    """A CA, and a certificate it signed for 127.0.0.1 and localhost; the CA's path."""
    def key() -> rsa.RSAPrivateKey:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def pem(k: rsa.RSAPrivateKey) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    now = datetime.now(UTC)
    ca_key, server_key = key(), key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nanofleet test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(hours=1))
          .not_valid_after(now + timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
              .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - timedelta(hours=1)).not_valid_after(now + timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName(
                  [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
              .sign(ca_key, hashes.SHA256()))
    (folder / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "server.crt").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (folder / "server.key").write_bytes(pem(server_key))
    return folder / "ca.crt"


def _redis_server(args: list[str], client: redis.Redis, log: Path) -> Iterator[None]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed")
    with log.open("wb") as out:
        proc = subprocess.Popen([exe, "--save", "", "--appendonly", "no", *args], stdout=out, stderr=subprocess.STDOUT)
    try:
        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_until(up, timeout=20, message="redis-server to answer")
        yield
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A Redis that speaks TLS only: (its rediss:// URL with no TLS parameters, the CA's path)."""
    folder = tmp_path_factory.mktemp("tls")
    ca, port = _write_certs(folder), _free_port()
    args = ["--port", "0", "--bind", "127.0.0.1", "--tls-port", str(port), "--tls-auth-clients", "no",
            "--tls-cert-file", str(folder / "server.crt"), "--tls-key-file", str(folder / "server.key"),
            "--tls-ca-cert-file", str(ca)]
    client = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca))
    yield from ((f"rediss://127.0.0.1:{port}/0", ca) for _ in _redis_server(args, client, folder / "redis.log"))


@pytest.fixture(scope="module")
def socket_redis() -> Iterator[Path]:
    """A Redis on a unix socket only: the socket's path (short: a socket's path has a length limit)."""
    folder = Path(tempfile.mkdtemp(prefix="nf-redis-"))
    path = folder / "redis.sock"
    args = ["--port", "0", "--unixsocket", str(path), "--unixsocketperm", "700", "--requirepass", SOCKET_PASSWORD]
    client = redis.Redis(unix_socket_path=str(path), password=SOCKET_PASSWORD)
    yield from (path for _ in _redis_server(args, client, folder / "redis.log"))
    shutil.rmtree(folder, ignore_errors=True)


def _app(url: str) -> Celery:
    return make_celery(load_settings(redis_url=url), name=f"test-{uuid.uuid4().hex[:6]}")


def _round_trip(app: Celery) -> None:
    """A message through the broker, a result through the backend, and a key through redbeat's client."""
    name = f"nanofleet-test-{uuid.uuid4().hex[:8]}"
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue(name)
        queue.put({"n": 1})
        message = queue.get(timeout=5)
        assert message.payload == {"n": 1}
        message.ack()
        queue.close()
    app.backend.store_result(name, {"ok": True}, "SUCCESS")
    assert app.backend.get_task_meta(name)["result"] == {"ok": True}
    beat = get_redis(app)
    beat.set(name, "1", ex=60)
    assert beat.get(name) == "1"


def _pool_classes(app: Celery) -> dict[str, type]:
    """The connection class each of the three uses."""
    with app.connection_for_write() as conn:
        broker_class = conn.default_channel.pool.connection_class
    return {"broker": broker_class, "backend": app.backend.connparams["connection_class"],
            "redbeat": get_redis(app).connection_pool.connection_class}


def test_redbeat_has_options_of_its_own(redis_server: str, redis_dbs: tuple[int, int]) -> None:
    """Beat, and every cron task's mirror of its schedule, warned that redbeat will stop falling back
    to the broker's transport options (helper's walkthrough)."""
    app = _app(f"{redis_server}/{redis_dbs[1]}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RedBeatConfig(app)
    _round_trip(app)


def test_rediss_uses_tls_everywhere(tls_redis: tuple[str, Path]) -> None:
    """rediss:// with the CA named: the broker (nanofleet's transport), the result backend and redbeat
    all connect over TLS and verify the server's certificate."""
    url, ca = tls_redis
    app = _app(f"{url}?ssl_ca_certs={ca}")
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, broker.Transport)
    classes = _pool_classes(app)
    assert all(issubclass(c, redis.SSLConnection) for c in classes.values()), classes
    _round_trip(app)


def test_rediss_verifies_the_certificate_unless_the_url_says_not_to(tls_redis: tuple[str, Path]) -> None:
    """No ssl_cert_reqs in the URL: verification is on (this test CA is in no trust store, so each of the
    three refuses the server); ssl_cert_reqs=none, as the URL says, turns it off."""
    url, _ = tls_redis
    app = _app(url)
    with pytest.raises(OperationalError, match="certificate verify failed"), app.connection_for_write() as conn:
        conn.default_channel.client.ping()
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        app.backend.client.ping()
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        get_redis(app).ping()
    _round_trip(_app(f"{url}?ssl_cert_reqs=none"))


def _socket_url(path: Path) -> str:
    return f"unix://:{SOCKET_PASSWORD}@{path}?db=3"


@pytest.mark.parametrize("server", ["tls_redis", "socket_redis"])
def test_a_worker_starts_and_answers(server: str, request: pytest.FixtureRequest, database_url: str,
                                     fake_llm: FakeLLM, tmp_path: Path) -> None:
    """A real worker on a rediss:// URL (it used to exit at start: the result backend refused the URL)
    and on a unix:// one (no such transport)."""
    found = request.getfixturevalue(server)
    url = f"{found[0]}?ssl_ca_certs={found[1]}" if server == "tls_redis" else _socket_url(found)
    env = make_env(database_url=database_url, redis_url=url, llm_url=fake_llm.url, workspace=tmp_path / "workspace")
    worker = start_worker(env, settings_from(env), tmp_path, queues="outbound", concurrency=2)
    worker.stop()


def test_a_unix_socket_url_reaches_redis_everywhere(socket_redis: Path) -> None:
    """unix://[:password@]/path?db=N (redis-py's form, which NANOFLEET_REDIS_URL takes): the broker,
    the result backend and redbeat use the socket, the password and that database."""
    app = _app(_socket_url(socket_redis))
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, broker.SocketTransport)  # the broker fixes apply on a socket too
    _round_trip(app)
    classes = _pool_classes(app)
    assert all(issubclass(c, redis.UnixDomainSocketConnection) for c in classes.values()), classes
    db = {n: redis.Redis(unix_socket_path=str(socket_redis), password=SOCKET_PASSWORD, db=n) for n in (0, 3)}
    assert db[3].dbsize() > 0 and db[0].dbsize() == 0


def test_flower_reads_the_broker_on_kombus_own_transport(socket_redis: Path) -> None:
    """Flower's broker view (queue lengths) reads the broker URL itself: it gets kombu's forms, and the
    socket's queue lengths."""
    from flower.utils.broker import Broker, RedisSocket

    url = _socket_url(socket_redis)
    config = broker.kombu_config(url)
    assert config == {"broker_url": f"redis+socket://:{SOCKET_PASSWORD}@{socket_redis}?virtual_host=3",
                      "broker_transport": None}
    assert isinstance(Broker(config["broker_url"]), RedisSocket)
    with Connection(config["broker_url"]) as conn:
        conn.default_channel.client.ping()
    assert broker.kombu_config("redis://127.0.0.1:6379/2") == {"broker_url": "redis://127.0.0.1:6379/2",
                                                               "broker_transport": None}
