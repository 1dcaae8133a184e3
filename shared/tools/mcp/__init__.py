"""MCP servers as tool providers: one supervised session per server and worker process, its tools
(`mcp_<server>_<tool>`, group `mcp`) added to the registry as they are listed, default-denied like
any tool. The MCP SDK is imported only when a server is configured."""

from __future__ import annotations

import sys

from shared.settings import Settings
from shared.tools.registry import ToolRegistry

GROUP = "mcp"
PROVIDER = "shared.tools.mcp.provider"


def attach(settings: Settings, registry: ToolRegistry) -> None:
    """Connect the configured servers (once per process) and add their tools to `registry`."""
    if not settings.tools.mcp_servers or GROUP in settings.tools.disabled_groups:
        return
    from shared.tools.mcp import provider

    provider.attach(settings, registry)


def shutdown() -> None:
    """Close this process's MCP sessions, if any were opened."""
    if PROVIDER in sys.modules:
        sys.modules[PROVIDER].shutdown()
