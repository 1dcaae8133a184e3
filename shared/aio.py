"""One background event loop per process, so sync Celery tasks can run async tools and keep
long-lived async clients (MCP sessions) between calls."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_pid = 0


def background_loop() -> asyncio.AbstractEventLoop:
    """The process's loop, started on first use (and again in a forked child)."""
    global _loop, _pid
    with _lock:
        if _loop is None or _pid != os.getpid():
            _loop = asyncio.new_event_loop()
            _pid = os.getpid()
            threading.Thread(target=_loop.run_forever, name="nanofleet-aio", daemon=True).start()
        return _loop


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run a coroutine on the background loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, background_loop()).result(timeout)
