"""MCP tool names that clash: `mcp_<server>_<tool>` maps server `a_b` tool `c` and server `a` tool
`b_c` to one name, and `read.file` and `read_file` too. The first (by configuration order across
servers, by listing order within one) is kept, the other skipped with a warning naming both; and
a per-server glob that also allows another server's tools is warned about at start."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest

from shared.settings import Settings, load_settings
from shared.tools import build_registry, mcp
from shared.tools.mcp import provider
from shared.tools.mcp.connection import MCPConnection
from shared.tools.mcp.tool import MCPTool
from shared.tools.registry import ToolRegistry
from tests.shared.tools.conftest import call, tool_settings
from tests.support.processes import ROOT


@pytest.fixture(autouse=True)
def close_sessions() -> Iterator[None]:
    yield
    mcp.shutdown()


def named(label: str, *tools: str) -> dict[str, Any]:
    """A stdio server whose tools are `tools`, each answering `<label> <tool>`."""
    return {"command": sys.executable, "args": ["-m", "tests.support.mcp_named_server"], "cwd": str(ROOT),
            "env": {"MCP_LABEL": label, "MCP_TOOL_NAMES": ",".join(tools)}}


def clashes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "MCP tool name clash" in r.getMessage()]


def test_the_first_configured_server_keeps_a_clashing_name(workspace: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = tool_settings(workspace, allowed=["mcp_*"], granted=[],
                             mcp_servers={"a_b": named("AB", "c"), "a": named("A", "b_c", "d")})
    with caplog.at_level(logging.WARNING):
        reg = build_registry(settings)
    assert {n for n in reg.names() if n.startswith("mcp_")} == {"mcp_a_b_c", "mcp_a_d"}
    assert call(reg, "mcp_a_b_c", {}).output == "AB c"  # server a_b's, whichever server listed first
    [warning] = clashes(caplog)
    assert "named mcp_a_b_c" in warning
    assert "keeping server 'a_b' tool 'c', skipping server 'a' tool 'b_c'" in warning


def test_a_server_keeps_the_first_of_two_tools_whose_names_clash(workspace: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    settings = tool_settings(workspace, allowed=["mcp_*"], granted=[],
                             mcp_servers={"fs": named("FS", "read.file", "read_file")})
    with caplog.at_level(logging.WARNING):
        reg = build_registry(settings)
    assert call(reg, "mcp_fs_read_file", {}).output == "FS read.file"
    [warning] = clashes(caplog)
    assert "keeping server 'fs' tool 'read.file', skipping server 'fs' tool 'read_file'" in warning


def _listed(name: str, *tools: str) -> MCPConnection:
    """A connection as it is once its server listed `tools` (never started: no server needed)."""
    config = load_settings(tools={"mcp_servers": {name: {"command": "true"}}}).tools.mcp_servers[name]
    conn = MCPConnection(name, config, connect_timeout=1, health_interval=1)
    conn.tools = {t: mcp_types.Tool(name=t, input_schema={"type": "object"}) for t in tools}
    return conn


@pytest.mark.parametrize("arrival", [("a_b", "a"), ("a", "a_b")])
def test_every_process_keeps_the_same_tool_whichever_server_lists_first(
        arrival: tuple[str, str], workspace: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = tool_settings(workspace, allowed=["mcp_*"], granted=[])
    reg = ToolRegistry(settings, [])
    add = provider._adder(reg, ["a_b", "a"])
    conns = {"a_b": _listed("a_b", "c"), "a": _listed("a", "b_c")}
    with caplog.at_level(logging.WARNING):
        for name in arrival:
            add(conns[name])
        add(conns[arrival[0]])  # listed again (a health check saw a change): nothing new to say
    tool = reg.get("mcp_a_b_c")
    assert isinstance(tool, MCPTool) and (tool.server, tool.remote_name) == ("a_b", "c")
    assert len(clashes(caplog)) == 1


def _globbed(allowed: list[str], *servers: str) -> Settings:
    return load_settings(tools={"allowed": allowed, "mcp_servers": {s: {"command": "true"} for s in servers}})


def test_a_per_server_glob_that_allows_another_servers_tools_is_reported() -> None:
    [problem] = provider.glob_overlaps(_globbed(["mcp_git_*"], "git", "git_hub", "gitlab"))
    assert "'mcp_git_*' allows the tools of server(s) 'git_hub' too" in problem
    assert provider.glob_overlaps(_globbed(["mcp_git_hub_*", "mcp_gitlab_*"], "git", "git_hub", "gitlab")) == []
    assert provider.glob_overlaps(_globbed(["mcp_*"], "git", "git_hub")) == []  # all servers' tools, on purpose


def test_the_glob_problem_is_logged_at_start(workspace: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = tool_settings(workspace, allowed=["mcp_a_*"], granted=[],
                             mcp_servers={"a": named("A", "d"), "a_b": named("AB", "c")})
    with caplog.at_level(logging.WARNING):
        reg = build_registry(settings)
    assert "'mcp_a_*' allows the tools of server(s) 'a_b' too" in caplog.text
    assert call(reg, "mcp_a_b_c", {}).ok  # what the warning is about: server a_b's tool is allowed
