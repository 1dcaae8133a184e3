"""Processes with no more rights over each other than an ordinary user's, as exec's commands have
over the processes of the user they run as. Under root, each such process gives up every
capability for good (its bounding set) before it starts its program: it is root in name only, and
without CAP_SYS_PTRACE it reads another process's /proc/<pid>/environ only if that one is of the
same user and dumpable. Not under root, processes are started as they are."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PR_CAPBSET_DROP = 24  # linux/prctl.h


def _bounding_set() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapBnd:")), 16)


def _drop_all() -> Callable[[], None] | None:
    """A preexec_fn that empties the bounding set (under root), so the program exec'd has no capability."""
    if os.geteuid() != 0 or not _bounding_set():
        return None  # an ordinary user, or root in name only already
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    libc = ctypes.CDLL(None, use_errno=True)

    def drop() -> None:
        for cap in range(last + 1):
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                os._exit(126)

    return drop


def available() -> str | None:
    """Why these tests cannot run here, or None."""
    if not sys.platform.startswith("linux"):
        return "needs Linux (/proc, prctl)"
    done = subprocess.run(["grep", "^CapEff", "/proc/self/status"], preexec_fn=_drop_all(), capture_output=True,
                          text=True, check=False)
    if done.returncode != 0 or done.stdout.split()[-1].strip("0"):
        return f"cannot give up capabilities here: {done.stdout.strip() or done.returncode}"
    return None


def popen(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, preexec_fn=_drop_all(), **kwargs)


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, preexec_fn=_drop_all(), capture_output=True, text=True, check=False, **kwargs)


def read_environ(pid: int) -> str | None:
    """Another process's environment as an ordinary process of its user reads it; None if refused."""
    done = run(["cat", f"/proc/{pid}/environ"], timeout=30)
    return done.stdout.replace("\0", "\n") if done.returncode == 0 else None
