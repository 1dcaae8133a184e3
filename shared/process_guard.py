"""Keep a nanofleet process's secrets from the commands `exec` runs as the same user: a process made
non-dumpable (Linux) has its /proc entries (environ, mem, fd) owned by root, so a process of its own
user without CAP_SYS_PTRACE cannot read its environment or memory. The flag is inherited across
fork and cleared by execve, so every program nanofleet starts (gateway, worker, beat, `up`,
`agent`) sets it again itself, as early as it can."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys

log = logging.getLogger(__name__)
PR_SET_DUMPABLE = 4  # linux/prctl.h
RUNTIME_VARIABLES = frozenset({"PATH", "HOME", "LANG", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"})


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The C library, for prctl(2); None where there is none to call (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def guard_process_secrets() -> bool:
    """Make this process, and the children it forks until they exec, non-dumpable; False if it
    cannot be done here (not Linux)."""
    c = libc()
    return c is not None and c.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def guard_or_warn(what: str) -> bool:
    """`guard_process_secrets`, with a warning on Linux when it fails (elsewhere there is no /proc
    to protect, and nothing to say)."""
    if guard_process_secrets():
        return True
    if sys.platform.startswith("linux"):
        log.warning("could not make %s non-dumpable: commands run by exec as its user may read its environment",
                    what)
    return False


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, with an environment without secrets. A process
    pool of spawned workers (uvicorn's, for `--workers N`) starts it on first use as a program of
    its own that inherits the whole environment and, never made non-dumpable, would show it to
    every process of its user. It needs no setting: only what finds and runs Python is kept."""
    from multiprocessing import resource_tracker

    saved = dict(os.environ)
    try:
        for name in [n for n in os.environ if n not in RUNTIME_VARIABLES and not n.startswith("LC_")]:
            del os.environ[name]
        resource_tracker.ensure_running()
    finally:
        os.environ.update(saved)
