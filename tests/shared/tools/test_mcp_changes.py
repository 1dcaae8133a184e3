"""A server that says its tools changed is listed again at once: a tool it added is offered within
seconds, not at the next health check (30 s by default; an hour here). On the 2026-07-28 protocol
the change comes on a `subscriptions/listen` stream nanofleet opens; on earlier versions the server
sends `notifications/tools/list_changed` unasked. Real servers over stdio: the SDK's, and a plain
JSON-RPC one on a handshake-era version (as most servers in use are)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.server.mcpserver import Context
from mcp.shared._httpx_utils import create_mcp_http_client
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.tools import build_registry, mcp
from shared.tools.mcp import connection
from shared.tools.registry import ToolRegistry
from tests.fakes.server import ThreadServer
from tests.shared.tools.conftest import call, tool_settings
from tests.support.processes import ROOT, wait_until

# The demo server with a tool `grow` that adds a tool `extra` and publishes the change
GROWING = '''
from mcp.server.mcpserver import Context
from tests.support.mcp_server import main, server

def extra(x: int) -> str:
    """A tool added while the server runs."""
    return f"extra {x}"

@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool `extra` and say that the tools changed."""
    server.add_tool(extra)
    await ctx.notify_tools_changed()
    return "grown"

main()
'''

# A server on a handshake-era protocol version (it knows no `server/discover`): `grow` adds `extra`
# and sends notifications/tools/list_changed, unasked, as such servers do.
LEGACY = r'''
import json, sys

tools = [{"name": "grow", "description": "Add the tool extra.", "inputSchema": {"type": "object"}}]

def send(**message):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()

for line in sys.stdin:
    msg = json.loads(line)
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        continue
    if method == "initialize":
        send(id=rid, result={"protocolVersion": msg["params"]["protocolVersion"], "serverInfo": {"name": "legacy",
             "version": "1"}, "capabilities": {"tools": {"listChanged": True}}})
    elif method == "tools/list":
        send(id=rid, result={"tools": tools})
    elif method == "tools/call" and msg["params"]["name"] == "grow":
        tools.append({"name": "extra", "description": "A tool added while the server runs.",
                      "inputSchema": {"type": "object"}})
        send(id=rid, result={"content": [{"type": "text", "text": "grown"}]})
        send(method="notifications/tools/list_changed")
    elif method == "tools/call":
        send(id=rid, result={"content": [{"type": "text", "text": "extra here"}]})
    else:
        send(id=rid, error={"code": -32601, "message": f"Method not found: {method}"})
'''


@pytest.fixture(autouse=True)
def close_sessions() -> Iterator[None]:
    yield
    mcp.shutdown()


def registry(workspace: Path, script: str) -> ToolRegistry:
    server: dict[str, Any] = {"command": sys.executable, "args": ["-c", script], "cwd": str(ROOT)}
    return build_registry(tool_settings(workspace, allowed=["mcp_live_*"], granted=[],
                                        mcp_servers={"live": server}, mcp_health_interval=3600))


@pytest.mark.parametrize("script", [GROWING, LEGACY], ids=["listen-2026", "notification-legacy"])
def test_a_tool_the_server_adds_is_offered_at_once(workspace: Path, script: str) -> None:
    """QA: a server that added a tool and said so was only listed again at the next health check."""
    reg = registry(workspace, script)
    assert "mcp_live_grow" in reg.names() and "mcp_live_extra" not in reg.names()
    assert call(reg, "mcp_live_grow", {}).output == "grown"
    wait_until(lambda: "mcp_live_extra" in reg.names(), timeout=10, message="the added tool to be offered")
    assert "mcp_live_extra" in [s["function"]["name"] for s in reg.specs()]
    assert call(reg, "mcp_live_extra", {"x": 7}).output in ("extra 7", "extra here")


def extra(x: int) -> str:
    """A tool added while the server runs."""
    return f"extra {x}"


async def grow(ctx: Context) -> str:
    """Add the tool `extra` and say that the tools changed."""
    from tests.support.mcp_server import server

    server.add_tool(extra)
    await ctx.notify_tools_changed()
    return "grown"


def noting(app: ASGIApp, methods: list[str]) -> ASGIApp:
    """`app`, noting the JSON-RPC method of each request POSTed to it."""
    async def note(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        messages = [await receive()]
        while messages[-1].get("more_body"):
            messages.append(await receive())
        with contextlib.suppress(ValueError, AttributeError):
            methods.append(json.loads(b"".join(m.get("body", b"") for m in messages)).get("method"))

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await app(scope, replay, send)

    return note


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
def test_changes_are_followed_after_an_idle_stream_ends(workspace: Path, monkeypatch: pytest.MonkeyPatch,
                                                        json_response: bool) -> None:
    """An HTTP server's change stream ends once idle past the client's read timeout (5 minutes; a
    second here): it is opened again, and a change after that is still seen at once."""
    from tests.support.mcp_server import server

    def short(headers: dict[str, str] | None = None) -> httpx2.AsyncClient:
        return create_mcp_http_client(headers=headers, timeout=httpx2.Timeout(30, read=1))

    monkeypatch.setattr(connection, "create_mcp_http_client", short)
    methods: list[str] = []
    site = ThreadServer(noting(server.streamable_http_app(json_response=json_response), methods))
    site.server.config.lifespan = "on"  # the app's session manager runs in its lifespan
    site.start()
    server.add_tool(grow)
    try:
        reg = build_registry(tool_settings(workspace, allowed=["mcp_web_*"], granted=[],
                                           mcp_servers={"web": {"url": f"{site.url}/mcp"}}, mcp_health_interval=3600))
        wait_until(lambda: methods.count("subscriptions/listen") >= 3, timeout=30,
                   message="the change stream to be opened again")
        assert call(reg, "mcp_web_grow", {}).output == "grown"
        wait_until(lambda: "mcp_web_extra" in reg.names(), timeout=10, message="the added tool to be offered")
    finally:
        server.remove_tool("grow")
        with contextlib.suppress(Exception):
            server.remove_tool("extra")
        site.stop()
