"""A data dir's PostgreSQL cluster as nanofleet made it before the embedded servers had passwords:
``initdb -A trust``, superuser ``nanofleet``, database ``nanofleet`` (what gateway/embedded.py did),
running while the block makes its data, stopped after."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from gateway import embedded
from tests.fakes.server import free_port
from tests.support.processes import wait_until


def _answers(port: int) -> bool:
    try:
        with psycopg.connect(f"host=127.0.0.1 port={port} user=nanofleet dbname=postgres connect_timeout=2"):
            return True
    except psycopg.OperationalError:
        return False


@contextmanager
def trust_cluster(data_dir: Path) -> Iterator[str]:
    """Yield the URL (no password: none is asked) of database ``nanofleet`` as superuser ``nanofleet``."""
    user, log = embedded._pg_user(), data_dir / "postgres.log"
    bin_dir = embedded._package_file("pgserver", "pginstall", "bin", "postgres").parent
    pgdata = embedded._pg_data_dir(data_dir, user)
    pgdata.mkdir(mode=0o700)
    if user is not None:
        os.chown(pgdata, user.pw_uid, user.pw_gid)
    initdb = [str(bin_dir / "initdb"), "-D", str(pgdata), "-A", "trust", "-U", "nanofleet", "--encoding=UTF8",
              "--locale=C"]
    assert embedded._run(initdb, log, user) == 0, log.read_text()
    port = free_port()
    proc = embedded._spawn([str(bin_dir / "postgres"), "-D", str(pgdata), "-h", "127.0.0.1", "-p", str(port),
                            "-k", ""], log, user)
    try:
        wait_until(lambda: proc.poll() is not None or _answers(port), timeout=60, message="the trust cluster")
        assert proc.poll() is None, log.read_text()
        with psycopg.connect(f"host=127.0.0.1 port={port} user=nanofleet dbname=postgres", autocommit=True) as conn:
            conn.execute('CREATE DATABASE "nanofleet"')
        yield f"postgresql+psycopg://nanofleet@127.0.0.1:{port}/nanofleet"
    finally:
        embedded._reap(proc, signal.SIGINT, 30)  # a fast shutdown
