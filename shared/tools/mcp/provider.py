"""The process's MCP sessions (one per configured server) and the registries their tools go to."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref
from collections.abc import Callable

from shared.aio import background_loop, run_sync
from shared.settings import Settings
from shared.tools.mcp.connection import MCPConnection, State
from shared.tools.mcp.tool import MCPTool, make_tool
from shared.tools.registry import ToolRegistry

__all__ = ["MCPConnection", "MCPTool", "State", "attach", "connections", "shutdown"]
_lock = threading.Lock()
_connections: dict[str, MCPConnection] = {}
_pid = 0
_starting: set[asyncio.Task[None]] = set()  # start-ups scheduled from the loop itself


def _connection(name: str, settings: Settings) -> MCPConnection:
    """This process's connection for server `name` as configured (a changed config is a new one)."""
    global _pid
    cfg = settings.tools.mcp_servers[name]
    key = f"{name}:{cfg.fingerprint()}:{settings.tools.mcp_connect_timeout}:{settings.tools.mcp_health_interval}"
    with _lock:
        if _pid != os.getpid():  # a forked child starts with no sessions of its own
            _connections.clear()
            _pid = os.getpid()
        if key not in _connections:
            _connections[key] = MCPConnection(name, cfg, connect_timeout=settings.tools.mcp_connect_timeout,
                                              health_interval=settings.tools.mcp_health_interval)
        return _connections[key]


def connections() -> list[MCPConnection]:
    """This process's connections, for status and tests."""
    with _lock:
        return list(_connections.values()) if _pid == os.getpid() else []


def _adder(registry: ToolRegistry) -> Callable[[MCPConnection], None]:
    """A listener that adds a connection's tools to `registry` while the registry is alive."""
    ref = weakref.ref(registry)

    def add(connection: MCPConnection) -> None:
        target = ref()
        if target is not None:
            for spec in list(connection.tools.values()):
                tool = make_tool(connection, spec)
                if target.get(tool.name) is None:
                    target.add(tool)

    return add


async def _start(conns: list[MCPConnection], registry: ToolRegistry) -> None:
    for conn in conns:
        conn.on_tools(_adder(registry))
        await conn.start()


def _on_background_loop() -> bool:
    try:
        return asyncio.get_running_loop() is background_loop()
    except RuntimeError:
        return False


def attach(settings: Settings, registry: ToolRegistry) -> None:
    """Connect the configured servers (once per process) and add their tools to `registry`.

    Waits at most NANOFLEET_TOOLS__MCP_CONNECT_TIMEOUT for the first listing, all servers at once;
    a server that is slower or broken is marked down and its tools appear when it comes up.
    """
    conns = [_connection(name, settings) for name in settings.tools.mcp_servers]
    if _on_background_loop():  # cannot block the loop the sessions run on
        task = asyncio.ensure_future(_start(conns, registry))
        _starting.add(task)
        task.add_done_callback(_starting.discard)
        return
    run_sync(_start(conns, registry))
    deadline = time.monotonic() + settings.tools.mcp_connect_timeout
    for conn in conns:
        conn.first_attempt.wait(max(0.0, deadline - time.monotonic()))


async def _stop_all(conns: list[MCPConnection]) -> None:
    await asyncio.gather(*(c.stop() for c in conns), return_exceptions=True)


def shutdown() -> None:
    """Close every session of this process (their server processes end)."""
    with _lock:
        conns = list(_connections.values()) if _pid == os.getpid() else []
        _connections.clear()
    if conns:
        run_sync(_stop_all(conns), timeout=30)
