"""MCP servers as tool providers: one supervised session per server and worker process, its tools
(`mcp_<server>_<tool>`, group `mcp`) added to the registry as they are listed, default-denied like
any tool. The MCP SDK is imported only when a server is configured."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from shared.settings import Settings
from shared.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from shared.tools.mcp.connection import MCPConnection

GROUP = "mcp"
PROVIDER = "shared.tools.mcp.provider"


def attach(settings: Settings, registry: ToolRegistry) -> None:
    """Connect the configured servers (once per process) and add their tools to `registry`."""
    if not settings.tools.mcp_servers or GROUP in settings.tools.disabled_groups:
        return
    from shared.tools.mcp import provider

    provider.attach(settings, registry)


def probe(settings: Settings) -> list[MCPConnection]:
    """Each configured server as found now: connected once and closed again (`nanofleet status`)."""
    from shared.tools.mcp import provider

    return provider.probe(settings)


def shutdown() -> None:
    """Close this process's MCP sessions, if any were opened."""
    if PROVIDER in sys.modules:
        sys.modules[PROVIDER].shutdown()
