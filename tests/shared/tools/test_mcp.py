"""MCP servers as tools, against a real MCP server over stdio (and one over streamable HTTP): one
session per process, tools named mcp_<server>_<tool> with their schemas, default-denied, per-call
timeouts, a broken server marked down without holding up the others, and a server that dies
mid-session and comes back."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.settings import Settings
from shared.tools import build_registry, mcp
from shared.tools.base import ErrorCode, ToolResult
from shared.tools.mcp.connection import MCPConnection
from shared.tools.mcp.provider import State, connections
from tests.fakes.server import ThreadServer
from tests.shared.tools.conftest import call, tool_settings
from tests.support.processes import ROOT, wait_until

OTHERS: list[MCPConnection] = []  # the sessions this process held before the test


@pytest.fixture(autouse=True)
def close_sessions() -> Iterator[None]:
    """Each test closes its sessions, and looks only at its own: another module's in-process gateway
    may hold one meanwhile (pytest-xdist runs modules' tests interleaved)."""
    OTHERS[:] = connections()
    yield
    mcp.shutdown()


def ours() -> list[MCPConnection]:
    return [c for c in connections() if all(c is not other for other in OTHERS)]


def demo(tmp_path: Path, **over: Any) -> dict[str, Any]:
    """The stdio demo server's settings; it logs each start to tmp_path/starts."""
    env = {"MCP_DEMO_STARTS": str(tmp_path / "starts"), "MCP_DEMO_BLOCK": str(tmp_path / "block")}
    return {"command": sys.executable, "args": ["-m", "tests.support.mcp_server"], "cwd": str(ROOT), "env": env,
            **over}


@pytest.fixture
def settings(workspace: Path, tmp_path: Path) -> Callable[..., Settings]:
    def make(servers: dict[str, Any] | None = None, allowed: list[str] | None = None, **tools: Any) -> Settings:
        return tool_settings(workspace, allowed=allowed or ["mcp_demo_*"], granted=[],
                             mcp_servers=servers or {"demo": demo(tmp_path)}, mcp_health_interval=0.5, **tools)

    return make


def starts(tmp_path: Path) -> int:
    path = tmp_path / "starts"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_tools_are_listed_with_their_schemas(settings: Callable[..., Settings]) -> None:
    reg = build_registry(settings())
    described = {d["name"]: d for d in reg.describe() if d["group"] == "mcp"}
    assert set(described) == {"mcp_demo_add", "mcp_demo_echo", "mcp_demo_slow", "mcp_demo_fail", "mcp_demo_crash"}
    assert described["mcp_demo_add"]["schema"]["required"] == ["a", "b"]
    spec = next(s for s in reg.specs() if s["function"]["name"] == "mcp_demo_add")["function"]
    assert spec["parameters"]["properties"]["a"]["type"] == "integer"
    assert spec["description"] == "[MCP server demo] Add two integers."


def test_calls_work_and_errors_are_results(settings: Callable[..., Settings]) -> None:
    reg = build_registry(settings())
    added = call(reg, "mcp_demo_add", {"a": 2, "b": 40})
    assert added.ok and added.output == "42" and added.untrusted
    assert call(reg, "mcp_demo_echo", {"text": "héllo"}).output == "héllo"
    failed = call(reg, "mcp_demo_fail", {"reason": "no such invoice"})
    assert failed.error == ErrorCode.FAILED and "no such invoice" in failed.message
    assert call(reg, "mcp_demo_add", {"a": "two"}).error == ErrorCode.FAILED


def test_default_denied_and_allowed_by_name_or_glob(settings: Callable[..., Settings]) -> None:
    denied = build_registry(settings(allowed=["time"]))
    assert call(denied, "mcp_demo_add", {"a": 1, "b": 2}).error == ErrorCode.NOT_ALLOWED
    assert not [s for s in denied.specs() if s["function"]["name"].startswith("mcp_")]
    one = build_registry(settings(allowed=["mcp_demo_add"]))
    assert [s["function"]["name"] for s in one.specs() if s["function"]["name"].startswith("mcp_")] == ["mcp_demo_add"]
    off = build_registry(settings(allowed=["*"], disabled_groups=["mcp"]))
    assert not [n for n in off.names() if n.startswith("mcp_")]


def test_one_session_per_process(settings: Callable[..., Settings], tmp_path: Path) -> None:
    first, second = build_registry(settings()), build_registry(settings())
    for reg in (first, second, first):
        assert call(reg, "mcp_demo_add", {"a": 1, "b": 1}).output == "2"
    assert starts(tmp_path) == 1 and len(ours()) == 1


def test_per_call_timeout_and_the_session_survives(settings: Callable[..., Settings], tmp_path: Path) -> None:
    reg = build_registry(settings(servers={"demo": demo(tmp_path, timeout=1)}))
    slow = call(reg, "mcp_demo_slow", {"seconds": 30})
    assert slow.error == ErrorCode.TIMEOUT and slow.retryable
    assert call(reg, "mcp_demo_add", {"a": 3, "b": 4}).output == "7"
    assert starts(tmp_path) == 1


def test_server_that_dies_is_down_then_comes_back(settings: Callable[..., Settings], tmp_path: Path) -> None:
    reg = build_registry(settings())
    assert call(reg, "mcp_demo_add", {"a": 1, "b": 2}).ok
    (tmp_path / "block").touch()  # from now on the server cannot start
    crashed = call(reg, "mcp_demo_crash", {})
    assert crashed.error == ErrorCode.FAILED and crashed.retryable

    def down() -> ToolResult | None:
        result = call(reg, "mcp_demo_add", {"a": 1, "b": 2})
        return result if not result.ok and "not connected" in result.message else None

    while_down = wait_until(down, timeout=30, message="calls to report the server down")
    assert isinstance(while_down, ToolResult) and while_down.retryable and while_down.status == "FAILED"
    wait_until(lambda: [c.state for c in ours()] == [State.DOWN], timeout=10, message="the server marked down")
    (tmp_path / "block").unlink()
    wait_until(lambda: call(reg, "mcp_demo_add", {"a": 20, "b": 22}).ok, timeout=60, message="the reconnect")
    assert call(reg, "mcp_demo_echo", {"text": "back"}).output == "back"
    assert starts(tmp_path) == 2 and [c.state for c in ours()] == [State.UP]


def test_broken_servers_do_not_hold_up_the_others(settings: Callable[..., Settings], tmp_path: Path) -> None:
    servers = {"demo": demo(tmp_path), "broken": {"command": str(tmp_path / "no-such-server")},
               "silent": {"command": "sleep", "args": ["60"]}, "empty": {}}
    reg = build_registry(settings(servers=servers, mcp_connect_timeout=3))
    wait_until(lambda: call(reg, "mcp_demo_add", {"a": 2, "b": 2}).output == "4", timeout=30, message="demo")
    by_name = {c.name: c for c in ours()}
    wait_until(lambda: by_name["silent"].state == State.DOWN, timeout=30, message="the silent server marked down")
    assert by_name["silent"].error.startswith("no answer within 3 s; waiting longer next time")
    assert by_name["broken"].state == State.DOWN and "FileNotFoundError" in by_name["broken"].error
    assert by_name["empty"].state == State.DOWN and "NANOFLEET_TOOLS__MCP_SERVERS__EMPTY" in by_name["empty"].error


@pytest.fixture
def http_server() -> Iterator[str]:
    from tests.support.mcp_server import server

    site = ThreadServer(server.streamable_http_app(json_response=True))
    site.server.config.lifespan = "on"  # the app's session manager runs in its lifespan
    site.start()
    yield f"{site.url}/mcp"
    site.stop()


def test_streamable_http_server(settings: Callable[..., Settings], http_server: str) -> None:
    reg = build_registry(settings(servers={"demo": {"url": http_server, "headers": {"X-Test": "1"}}}))
    assert call(reg, "mcp_demo_add", {"a": 5, "b": 6}).output == "11"


def shout(words: str) -> str:
    return words.upper()


def test_a_server_that_changes_its_tools_is_followed(settings: Callable[..., Settings], http_server: str) -> None:
    """A tool that changed its schema kept the old one (the model sent arguments the server refused),
    and a tool the server dropped was still offered."""
    from tests.support.mcp_server import crash, echo, server

    reg = build_registry(settings(servers={"demo": {"url": http_server}}))
    wait_until(lambda: call(reg, "mcp_demo_add", {"a": 1, "b": 1}).ok, timeout=30, message="the server")
    assert {"mcp_demo_crash", "mcp_demo_echo"} <= set(reg.names())
    server.remove_tool("crash")
    server.remove_tool("echo")
    server.add_tool(shout, name="echo", description="Shout the words back.")
    try:
        def followed() -> bool:
            held = reg.get("mcp_demo_echo")
            return "mcp_demo_crash" not in reg.names() and held is not None and "Shout" in held.description

        wait_until(followed, timeout=30, message="the new listing to be taken up")
        assert reg.specs() == [s for s in reg.specs() if s["function"]["name"] != "mcp_demo_crash"]
        [spec] = [s for s in reg.specs() if s["function"]["name"] == "mcp_demo_echo"]
        assert spec["function"]["parameters"]["required"] == ["words"]
        assert call(reg, "mcp_demo_echo", {"words": "hi"}).output == "HI"
    finally:
        server.remove_tool("echo")
        server.add_tool(echo)
        server.add_tool(crash)


def test_a_server_slower_to_start_than_the_timeout_comes_up(settings: Callable[..., Settings],
                                                            tmp_path: Path) -> None:
    """Each attempt waited the connect timeout and killed the server: one that needs longer to start
    (an npx download) never came up."""
    slow = demo(tmp_path)
    slow["env"]["MCP_DEMO_START_DELAY"] = "2.5"
    reg = build_registry(settings(servers={"demo": slow}, mcp_connect_timeout=1))
    wait_until(lambda: call(reg, "mcp_demo_add", {"a": 2, "b": 3}).output == "5", timeout=60,
               message="the slow server to come up")
    [conn] = ours()
    assert conn.state == State.UP and starts(tmp_path) >= 2  # the first attempts gave up on it
