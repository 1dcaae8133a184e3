"""A real MCP server over stdio whose tools are named by the test: `python -m tests.support.mcp_named_server`.

MCP_TOOL_NAMES is a comma-separated list of tool names (dots allowed, as MCP allows them); each tool
answers `<MCP_LABEL> <its name>`, so a test can tell which server and tool a call reached.
MCP_TOOL_SCHEMAS, a JSON object by tool name, gives tools the input schema the server lists for them.
"""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import MCPServer

LABEL = os.environ.get("MCP_LABEL", "named")
server = MCPServer(LABEL, log_level="CRITICAL")


def _answer(name: str) -> str:
    return f"{LABEL} {name}"


def main() -> None:
    for name in filter(None, os.environ.get("MCP_TOOL_NAMES", "").split(",")):
        server.add_tool(lambda name=name: _answer(name), name=name, description=f"Says which tool: {name}.")
    for name, schema in json.loads(os.environ.get("MCP_TOOL_SCHEMAS", "{}")).items():
        server._tool_manager.get_tool(name).parameters = schema  # what list_tools shows; calls are not checked
    server.run("stdio")


if __name__ == "__main__":
    main()
