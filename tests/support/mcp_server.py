"""A real MCP server over stdio for the tests: `python -m tests.support.mcp_server`.

Tools: `add`, `echo`, `slow` (sleeps), `fail` (answers with an error) and `crash` (the process
exits mid-call, as a crashed server would). Each start appends a line to the file named by
MCP_DEMO_STARTS, so tests can see the server being started again after a crash; while the file
named by MCP_DEMO_BLOCK exists, the server exits at start (it is "down"); MCP_DEMO_START_DELAY
seconds pass before it answers. `server` also serves
streamable HTTP through `server.streamable_http_app()`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("demo", log_level="CRITICAL")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return text


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "slept"


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the reason."""
    raise ToolError(reason)


@server.tool()
def crash() -> str:
    """Exit the server process at once."""
    sys.stdout.flush()
    os._exit(3)


def main() -> None:
    block = os.environ.get("MCP_DEMO_BLOCK")
    if block and os.path.exists(block):
        sys.exit(1)
    starts = os.environ.get("MCP_DEMO_STARTS")
    if starts:
        with open(starts, "a") as fh:
            fh.write(f"{os.getpid()}\n")
    time.sleep(float(os.environ.get("MCP_DEMO_START_DELAY", "0")))  # a server slow to start (npx downloading)
    server.run("stdio")


if __name__ == "__main__":
    main()
