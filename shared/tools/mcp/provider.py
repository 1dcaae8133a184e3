"""The process's MCP sessions (one per configured server) and the registries their tools go to."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from fnmatch import fnmatchcase

from shared.aio import background_loop, run_sync
from shared.settings import Settings
from shared.tools.base import Tool
from shared.tools.mcp.connection import MCPConnection, State
from shared.tools.mcp.tool import MCPTool, make_tool, schema_problem, tool_name
from shared.tools.registry import ToolRegistry

__all__ = ["MCPConnection", "MCPTool", "State", "attach", "connections", "probe", "shutdown"]
log = logging.getLogger(__name__)
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


def _origin(tool: Tool) -> str:
    if isinstance(tool, MCPTool):
        return f"server '{tool.server}' tool '{tool.remote_name}'"
    return f"the tool '{tool.name}'"


def _hint(held: Tool, new: MCPTool) -> str:
    if isinstance(held, MCPTool) and held.server == new.server:
        return "tool names keep only letters, digits, '_' and '-'"
    return "rename one of the servers in NANOFLEET_TOOLS__MCP_SERVERS to offer both"


def glob_overlaps(settings: Settings) -> list[str]:
    """What is wrong with each per-server glob (`mcp_<server>_*`) in NANOFLEET_TOOLS__ALLOWED that
    allows another server's tools too (`mcp_git_*` those of `git_hub`)."""
    servers, allowed = list(settings.tools.mcp_servers), set(settings.tools.allowed)
    found = []
    for server in servers:
        glob = f"{tool_name(server, '')}*"
        others = [o for o in servers if o != server and fnmatchcase(tool_name(o, "x"), glob)]
        if glob in allowed and others:
            found.append(f"NANOFLEET_TOOLS__ALLOWED: '{glob}' allows the tools of server(s) "
                         f"{', '.join(repr(o) for o in others)} too, not only those of '{server}': allow those "
                         "by name, or rename a server so that no server's name starts with another's and '_'")
    return found


def _first(new: MCPTool, held: Tool, order: dict[str, int]) -> bool:
    """Whether `new` takes a name `held` has: only a tool of a server configured before held's, so
    that every process keeps the same one whichever server answers first. Within one server, the
    tool it lists first keeps the name."""
    if not isinstance(held, MCPTool) or held.server == new.server:
        return False
    return order.get(new.server, len(order)) < order.get(held.server, len(order))


def _adder(registry: ToolRegistry, servers: list[str]) -> Callable[[MCPConnection], None]:
    """A listener that adds a connection's tools to `registry` while the registry is alive. Two tools
    whose names map to the same `mcp_<server>_<tool>` (server `a_b` tool `c` and server `a` tool
    `b_c`; `read.file` and `read_file`) cannot both be offered: the first is kept and the other
    skipped, with a warning naming both. A tool whose input schema the model's API would refuse is
    skipped, with a warning saying why."""
    ref = weakref.ref(registry)
    order = {name: i for i, name in enumerate(servers)}
    warned: set[tuple[str, str]] = set()

    def add(connection: MCPConnection) -> None:
        target = ref()
        if target is None:
            return
        listed = dict(connection.tools)
        for name in target.names():  # tools the server no longer lists are not offered any more
            held = target.get(name)
            if isinstance(held, MCPTool) and held.server == connection.name and held.remote_name not in listed:
                target.remove(name)
        for spec in listed.values():
            tool = make_tool(connection, spec)
            held = target.get(tool.name)
            if _refused(target, tool, held, warned):
                continue
            if held is None or _origin(held) == _origin(tool):  # new, or listed again (its schema may have changed)
                target.add(tool)
            else:
                kept, skipped = (tool, held) if _first(tool, held, order) else (held, tool)
                if kept is tool:
                    target.add(tool)
                if (key := (_origin(kept), _origin(skipped))) not in warned:
                    warned.add(key)
                    log.warning("MCP tool name clash: %s and %s are both named %s; keeping %s, skipping %s (%s)",
                                _origin(held), _origin(tool), tool.name, *key, _hint(held, tool))

    return add


def _refused(registry: ToolRegistry, tool: MCPTool, held: Tool | None, warned: set[tuple[str, str]]) -> bool:
    """Whether `tool`'s input schema is one the model's API would refuse (then it is not offered, nor
    an earlier listing of it, and a warning says why once)."""
    if (problem := schema_problem(tool.Args.input_schema)) is None:
        return False
    if held is not None and _origin(held) == _origin(tool):
        registry.remove(tool.name)
    if (key := (_origin(tool), problem)) not in warned:
        warned.add(key)
        log.warning("MCP %s is not offered to the model: %s", _origin(tool), problem)
    return True


async def _start(conns: list[MCPConnection], registry: ToolRegistry) -> None:
    add = _adder(registry, [conn.name for conn in conns])
    for conn in conns:
        conn.on_tools(add)
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
    for problem in glob_overlaps(settings):
        log.warning("%s", problem)
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


async def _probe_all(conns: list[MCPConnection]) -> None:
    await asyncio.gather(*(c.probe() for c in conns), return_exceptions=True)


def probe(settings: Settings) -> list[MCPConnection]:
    """Each configured server as this process finds it now, all at once, each connected within
    NANOFLEET_TOOLS__MCP_CONNECT_TIMEOUT and closed again (these are not the process's sessions)."""
    tools = settings.tools
    conns = [MCPConnection(name, cfg, connect_timeout=tools.mcp_connect_timeout,
                           health_interval=tools.mcp_health_interval) for name, cfg in tools.mcp_servers.items()]
    run_sync(_probe_all(conns))
    return conns


async def _stop_all(conns: list[MCPConnection]) -> None:
    await asyncio.gather(*(c.stop() for c in conns), return_exceptions=True)


def shutdown() -> None:
    """Close every session of this process (their server processes end)."""
    with _lock:
        conns = list(_connections.values()) if _pid == os.getpid() else []
        _connections.clear()
    if conns:
        run_sync(_stop_all(conns), timeout=30)
