"""Who may use the embedded Redis and PostgreSQL of gateway/embedded.py: passwords made from one
secret in the data dir, Redis's config file, PostgreSQL's pg_hba.conf and roles.

The secret (``<data_dir>/embedded.secret``, mode 0600, made at the first start) is readable only by
the user running ``up``; under a root ``up``, exec runs its commands as ``nobody``. Each password is derived
from it (HMAC-SHA256, one per use), so a password that leaks gives away neither the secret nor the
others, and deleting the file makes new ones at the next start. Nothing secret goes on a command
line (``/proc/<pid>/cmdline`` is world-readable): Redis reads its password from a 0600 config file,
initdb from a 0600 ``--pwfile``, PostgreSQL gets the others as SCRAM verifiers over a pipe or a
connection.

PostgreSQL: ``nanofleet`` is the bootstrap superuser (as in the clusters older nanofleet versions
made with trust auth), which only ``up`` logs in as, to set things up; the app connects as
``nanofleet_app``, no superuser, owner of database ``nanofleet`` and of its tables (migrations need
no more), so the app's URL cannot run programs (``COPY ... TO PROGRAM``) or read files on the host.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

SECRET_FILE = "embedded.secret"
ADMIN_ROLE = "nanofleet"  # the bootstrap superuser
APP_ROLE = "nanofleet_app"
SCRAM_ITERATIONS = 4096  # PostgreSQL's default (scram_iterations)
# Off in the embedded Redis: the password's holder could otherwise write files where Redis runs
# (CONFIG SET dir/dbfilename + SAVE, as root under a root `up`), load code (MODULE LOAD), crash it
# (DEBUG), make it copy another server (REPLICAOF) or change who may log in (ACL). nanofleet, Celery,
# kombu and redbeat use none of them.
REDIS_DISABLED = ("ACL", "CONFIG", "DEBUG", "MODULE", "REPLICAOF", "SLAVEOF")
_TRUST = re.compile(r"(?<=\s)trust(?=\s|$)")


class SecretError(RuntimeError):
    """The secret file cannot be trusted or read; the message says what to do."""


def load_secret(data_dir: Path) -> str:
    """The data dir's secret, made (mode 0600) if there is none yet."""
    path = data_dir / SECRET_FILE
    if not path.exists() and not path.is_symlink():
        _create_exclusive(path, secrets.token_urlsafe(32) + "\n")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o077 or not stat.S_ISREG(st.st_mode):
            raise SecretError(f"{path} must be a file of uid {os.geteuid()} (who runs `up`) with mode 0600; it is "
                              f"uid {st.st_uid}, mode {stat.filemode(st.st_mode)}: others may know it, so delete it "
                              "(new passwords are made at the next start)")
        secret = f.read().strip()
    if len(secret) < 32:
        raise SecretError(f"{path} is empty or cut short; delete it (new passwords are made at the next start)")
    return secret


def _create_exclusive(path: Path, text: str) -> None:
    """Write `path` (0600) whole or not at all, and never over one another process wrote first."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    write_private(tmp, text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


def password(secret: str, use: str) -> str:
    """The password for `use` ("redis", a PostgreSQL role): URL-safe, 43 characters."""
    digest = hmac.digest(secret.encode(), use.encode(), "sha256")
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def write_private(path: Path, text: str, owner: tuple[int, int] | None = None) -> None:
    """Replace `path` with `text`, mode 0600 (and `owner`'s) from the first byte."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        if owner is not None:
            os.fchown(f.fileno(), *owner)
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _quoted(value: str) -> str:
    """A value for redis.conf, which splits its lines as a shell would."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def redis_config(*, port: int, redis_dir: Path, log_file: Path, secret_password: str) -> str:
    """redis.conf: 127.0.0.1 only, AOF in `redis_dir`, a password, the REDIS_DISABLED commands off."""
    lines = ["bind 127.0.0.1", f"port {port}", "daemonize no", f"dir {_quoted(str(redis_dir))}", "appendonly yes",
             'save ""', "maxmemory-policy noeviction", f"pidfile {_quoted(str(redis_dir / 'redis.pid'))}",
             f"logfile {_quoted(str(log_file))}", f"requirepass {_quoted(secret_password)}",
             *(f'rename-command {name} ""' for name in REDIS_DISABLED)]
    return "\n".join(lines) + "\n"


def scram_verifier(secret_password: str) -> str:
    """What PostgreSQL stores for a SCRAM-SHA-256 password (RFC 7677; the password is ASCII, so
    SASLprep leaves it as it is): set with it, the password itself never reaches the server."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", secret_password.encode(), salt, SCRAM_ITERATIONS)
    stored = hashlib.sha256(hmac.digest(salted, b"Client Key", "sha256")).digest()
    server = hmac.digest(salted, b"Server Key", "sha256")
    b64 = base64.b64encode
    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{b64(salt).decode()}${b64(stored).decode()}:{b64(server).decode()}"


def without_trust(hba: str) -> str:
    """pg_hba.conf with each rule's `trust` method (older nanofleet clusters) made scram-sha-256."""
    def rule(line: str) -> str:
        words = line.split()
        return _TRUST.sub("scram-sha-256", line) if words and words[0].startswith(("local", "host")) else line

    return "".join(rule(line) for line in hba.splitlines(keepends=True))


@contextlib.contextmanager
def handed_file(text: str, *, near: Path, owner: tuple[int, int] | None) -> Iterator[Path]:
    """A 0600 file holding `text`, readable by `owner` (uid, gid: who runs PostgreSQL; None: us)
    alone, in a private dir in `near` (a place the owner can reach), removed after the block."""
    with tempfile.TemporaryDirectory(prefix=".nanofleet-", dir=near) as tmp:
        if owner is not None:
            os.chown(tmp, *owner)
        path = Path(tmp, "pwfile")
        write_private(path, text, owner)
        yield path


def provision(conn: psycopg.Connection[tuple[object, ...]], *, database: str, app_password: str) -> None:
    """As the superuser, connected to database `postgres`: the app role, with `app_password` and no
    more rights than its own, and `database`, owned by it."""
    role = sql.Identifier(APP_ROLE)
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,)).fetchone() is None:
        conn.execute(sql.SQL("CREATE ROLE {}").format(role))
    conn.execute(sql.SQL("ALTER ROLE {} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
                         "PASSWORD {}").format(role, sql.Literal(scram_verifier(app_password))))
    db = sql.Identifier(database)
    if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(db, role))
    else:
        conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(db, role))


# The superuser's tables, views and sequences (those of a table go with it) in schema public, where
# an older nanofleet, which ran as the superuser, made them: the app role gets them.
_HAND_OVER = """
DO $$
DECLARE
  stmt text;
BEGIN
  FOR stmt IN
    SELECT format('ALTER %s %s OWNER TO %I', CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                  WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END, c.oid::regclass, {app})
      FROM pg_class c
     WHERE c.relnamespace = 'public'::regnamespace AND c.relowner = current_user::text::regrole
       AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
       AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                       AND d.deptype IN ('a', 'i'))
  LOOP
    EXECUTE stmt;
  END LOOP;
END $$
"""


def hand_over(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """As the superuser, connected to the app's database: give the app role what the superuser owns there."""
    conn.execute(sql.SQL(_HAND_OVER).format(app=sql.Literal(APP_ROLE)))
