"""`nanofleet up`: the whole system in one command, ready, and gone after Ctrl-C or when `up` dies;
one per data dir and port; its embedded servers let in only who has their passwords."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import psycopg
import pytest

from gateway.status import Unavailable
from gateway.supervisor import owning
from shared.constants import WORKER_ALIVE_FILE
from tests.fakes.server import free_port
from tests.support.legacy_postgres import trust_cluster
from tests.support.processes import ROOT, wait_until
from tests.support.stack import API_KEY, Stack

WhileUp = Callable[[psutil.Process, Path, int], None]  # `up`, its output, its port


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _start_up(env: dict[str, str], log: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "gateway.cli", "up", "--port", str(port),
                                 "--concurrency", "4", *extra], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def _wait_up(proc: subprocess.Popen[bytes], log: Path, port: int, env: dict[str, str]) -> None:
    """`up` says it is up once its gateway answers and its worker takes tasks, then it becomes ready."""
    started = psutil.Process(proc.pid).create_time()
    wait_until(lambda: proc.poll() is not None or "nanofleet: up at" in log.read_text(), timeout=120,
               message="`up` to say it is up")
    assert proc.poll() is None, log.read_text()
    assert _ready(f"http://127.0.0.1:{port}/healthz"), "`up at` was printed before the gateway answered"
    alive = Path(env["NANOFLEET_DATA_DIR"]) / WORKER_ALIVE_FILE
    assert alive.exists() and alive.stat().st_mtime >= started, "`up at` was printed before the worker's heartbeat"
    wait_until(lambda: proc.poll() is not None or _ready(f"http://127.0.0.1:{port}/readyz"), timeout=120,
               message="/readyz to answer 200")
    assert proc.poll() is None, log.read_text()


def _up_and_down(env: dict[str, str], log: Path, *extra: str, while_up: WhileUp | None = None) -> str:
    port = free_port()
    proc = _start_up(env, log, port, *extra)
    try:
        _wait_up(proc, log, port, env)
        family = psutil.Process(proc.pid).children(recursive=True)
        assert len(family) >= 3  # gateway, worker, beat (and their own children)
        if while_up is not None:
            while_up(psutil.Process(proc.pid), log, port)
            family = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, log.read_text()
        wait_until(lambda: not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
                   timeout=30, message="every child process to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
    return log.read_text()


def _kill_beat(up: psutil.Process, log: Path, _port: int) -> None:
    """Beat exits by design when it loses its lock (a Redis restart): `up` starts it again."""
    def beats() -> list[psutil.Process]:
        found = []
        for child in up.children():
            with contextlib.suppress(psutil.Error):  # the killed one is a zombie until `up` reaps it
                if "beat" in child.cmdline():
                    found.append(child)
        return found

    [beat] = beats()
    os.killpg(beat.pid, signal.SIGKILL)
    wait_until(lambda: [b for b in beats() if b.pid != beat.pid], timeout=30, message="a new beat")
    assert "beat exited with code -9; starting it again" in log.read_text()


def test_up_on_configured_services_starts_a_child_again_when_it_exits(make_stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s: Stack = make_stack()
    output = _up_and_down(s.env, tmp_path / "up.log", while_up=_kill_beat)
    assert "embedded" not in output


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A data dir the unprivileged PostgreSQL user can reach (pytest's tmp dirs are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="nanofleet-up-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def _servers_of(data_dir: Path) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if str(data_dir) in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE]


def _servers(up: psutil.Process) -> dict[str, tuple[psutil.Process, int]]:
    """`up`'s embedded servers by name, and the port each listens on."""
    found = {}
    for child in up.children():
        if child.name() in ("redis-server", "postgres"):
            [port] = {c.laddr.port for c in child.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
            found[child.name()] = (child, port)
    return found


def _refuses_strangers(up: psutil.Process) -> None:
    """The security review's probes, from 127.0.0.1 without a password (what a command exec runs,
    as `nobody`, could do): Redis said +OK to CONFIG SET dir, PostgreSQL let superuser `nanofleet` in."""
    servers = _servers(up)
    with socket.create_connection(("127.0.0.1", servers["redis-server"][1]), timeout=5) as sock:
        sock.sendall(b"SET stolen 1\r\n")
        assert sock.recv(100).startswith(b"-NOAUTH"), "Redis answers without a password"
    for role in ("nanofleet", "nanofleet_app"):
        with pytest.raises(psycopg.OperationalError, match="no password supplied"):
            psycopg.connect(f"host=127.0.0.1 port={servers['postgres'][1]} user={role} dbname=nanofleet").close()


def _exports(data_dir: Path) -> dict[str, str]:
    """The URLs `up` wrote for other terminals, in a file only its user reads: they carry passwords."""
    path = data_dir / "embedded.env"
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    return dict(shlex.split(line)[1].split("=", 1) for line in path.read_text().splitlines())


def _in_another_terminal(env: dict[str, str], data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`nanofleet <args>` in a shell that first sourced the file `up` named, as its output says."""
    shell = ["sh", "-c", '. "$0" && exec "$@"', str(data_dir / "embedded.env"), sys.executable, "-m", "gateway.cli"]
    return subprocess.run([*shell, *args], cwd=ROOT, env={k: v for k, v in env.items() if k != "NANOFLEET_DATA_DIR"},
                          capture_output=True, text=True, timeout=120)


def _a_turn(port: int, message: str) -> None:
    """A message through the API, answered by the worker `up` runs (the fake LLM echoes it)."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=60) as client:
        cid = client.post("/api/v1/conversations").json()["conversationId"]
        answer = client.post(f"/api/v1/conversations/{cid}/chat", json={"message": message})
        assert answer.status_code == 200, answer.text
        assert answer.json()["assistantMessage"] == f"echo: {message}"


def _secrets_of(data_dir: Path) -> list[str]:
    """The secret file's content and the passwords in the URLs `up` handed out."""
    secret = data_dir / "embedded.secret"
    st = secret.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    passwords = [urlsplit(url).password for url in _exports(data_dir).values()]
    assert all(passwords) and len(passwords) == 2
    return [secret.read_text().strip(), *(p for p in passwords if p)]


def _second_up_and_another_terminal(env: dict[str, str], data_dir: Path, seen: list[str]) -> WhileUp:
    def check(up: psutil.Process, log: Path, port: int) -> None:
        _refuses_strangers(up)
        servers = [p for p, _ in _servers(up).values()]
        assert len(servers) == 2, up.children()
        second = _cli(env, "up", "--embedded", "--port", str(free_port()))
        assert second.returncode == 1
        assert f"another nanofleet up is already running for data dir {data_dir} (pid {up.pid})" in second.stderr
        assert all(p.is_running() for p in servers), "the second `up` stopped the first one's servers"

        assert f"in another terminal: . {data_dir / 'embedded.env'}" in log.read_text()
        assert set(_exports(data_dir)) == {"NANOFLEET_DATABASE_URL", "NANOFLEET_REDIS_URL"}
        seen.extend(_secrets_of(data_dir))
        _a_turn(port, "hello")
        status = _in_another_terminal(env, data_dir, "status")
        assert "database   ok" in status.stdout and "redis      ok" in status.stdout, status.stdout + status.stderr
        assert not [p for p in seen if p in status.stdout + status.stderr]

    return check


def _embedded_env(s: Stack, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in s.env.items() if k not in ("NANOFLEET_REDIS_URL", "NANOFLEET_DATABASE_URL")}
    return env | {"NANOFLEET_DATA_DIR": str(data_dir)}


def test_up_starts_embedded_servers_when_none_is_configured(make_stack, open_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env, secrets = _embedded_env(make_stack(), open_dir), list[str]()
    output = _up_and_down(env, tmp_path / "up.log", "--embedded",
                          while_up=_second_up_and_another_terminal(env, open_dir, secrets))
    assert "--embedded: started an embedded Redis at redis://:***@127.0.0.1:" in output
    assert "--embedded: started an embedded PostgreSQL at postgresql+psycopg://nanofleet_app:***@" in output
    assert "configured or answering" not in output  # with --embedded, whether one answers does not matter
    assert not [p for p in secrets if p in output], "`up` or a child printed a password"  # its children's logs too
    assert not _servers_of(open_dir), "an embedded server outlived `up`"
    assert not (open_dir / "embedded.env").exists()


def _continues_the_old_conversation(env: dict[str, str], data_dir: Path) -> WhileUp:
    def check(up: psutil.Process, log: Path, port: int) -> None:
        _refuses_strangers(up)
        said = _in_another_terminal(env, data_dir, "agent", "-m", "and me")  # session cli:default, as before
        assert said.returncode == 0 and said.stdout.strip() == "echo: and me", said.stdout + said.stderr
        url = _exports(data_dir)["NANOFLEET_DATABASE_URL"].replace("+psycopg", "", 1)
        with psycopg.connect(url) as conn:
            said_before = conn.execute("SELECT conversation_id, content FROM messages WHERE role = 'USER' "
                                       "ORDER BY seq").fetchall()
        assert [text for _, text in said_before] == ["remember me", "and me"]
        assert said_before[0][0] == said_before[1][0], "not the same conversation"
        _a_turn(port, "hello")

    return check


def test_up_on_an_older_data_dir_keeps_its_data_and_asks_for_passwords(
        make_stack: Callable[..., Stack], open_dir: Path, tmp_path: Path) -> None:
    """An upgrade in place: the data dir of a nanofleet whose embedded PostgreSQL trusted everyone on
    127.0.0.1, and whose superuser made the tables and a conversation."""
    env = _embedded_env(make_stack(), open_dir)
    with trust_cluster(open_dir) as old_url:
        said = _cli(env | {"NANOFLEET_DATABASE_URL": old_url}, "agent", "-m", "remember me")
        assert said.returncode == 0 and said.stdout.strip() == "echo: remember me", said.stdout + said.stderr
    _up_and_down(env, tmp_path / "up.log", "--embedded", while_up=_continues_the_old_conversation(env, open_dir))
    hba = (open_dir / "postgres" / "pg_hba.conf").read_text()
    assert not [line for line in hba.splitlines() if "trust" in line and not line.lstrip().startswith("#")]


def test_every_child_dies_with_up(make_stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`kill -9` (or the OOM killer) of `up`: its gateway, worker and beat stop too and free the port."""
    s: Stack = make_stack()
    port, log = free_port(), tmp_path / "up.log"
    proc = _start_up(s.env, log, port)
    family: list[psutil.Process] = []
    try:
        _wait_up(proc, log, port, s.env)
        family = psutil.Process(proc.pid).children(recursive=True)
        assert len(family) >= 3
        proc.kill()
        proc.wait(30)
        wait_until(lambda: not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
                   timeout=60, message="every child of the killed `up` to exit")
        assert not _ready(f"http://127.0.0.1:{port}/healthz")
    finally:
        if proc.poll() is None:
            family = psutil.Process(proc.pid).children(recursive=True)
            proc.kill()
        for p in family:
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_up_and_gateway_refuse_a_port_in_use(make_stack) -> None:  # type: ignore[no-untyped-def]
    s: Stack = make_stack()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for command in ("up", "gateway"):
            done = _cli(s.env, command, "--port", str(port))
            assert done.returncode == 1, (command, done.stdout, done.stderr)
            assert f"nanofleet: port {port} on 127.0.0.1 is in use" in done.stderr
            assert "Traceback" not in done.stderr and "up at" not in done.stdout


def test_data_dir_lock_names_its_holder(tmp_path: Path) -> None:
    held = pytest.raises(Unavailable, match=rf"already running for data dir .*data \(pid {os.getpid()}\)")
    with owning(tmp_path / "data"), held, owning(tmp_path / "data"):
        pass
    with owning(tmp_path / "data"):  # free again once the holder let go
        pass
