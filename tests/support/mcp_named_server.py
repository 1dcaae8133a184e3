"""A real MCP server over stdio whose tools are named by the test: `python -m tests.support.mcp_named_server`.

MCP_TOOL_NAMES is a comma-separated list of tool names (dots allowed, as MCP allows them); each tool
answers `<MCP_LABEL> <its name>`, so a test can tell which server and tool a call reached.
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

LABEL = os.environ.get("MCP_LABEL", "named")
server = MCPServer(LABEL, log_level="CRITICAL")


def _answer(name: str) -> str:
    return f"{LABEL} {name}"


def main() -> None:
    for name in filter(None, os.environ.get("MCP_TOOL_NAMES", "").split(",")):
        server.add_tool(lambda name=name: _answer(name), name=name, description=f"Says which tool: {name}.")
    server.run("stdio")


if __name__ == "__main__":
    main()
