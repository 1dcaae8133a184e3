"""An MCP tool whose input schema the model's API would refuse (not an object schema, or not valid
JSON Schema) is not offered: one such tool in the request fails every turn. Its siblings are, and
a warning says which tool was skipped and why."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest

from shared.settings import load_settings
from shared.tools import build_registry, mcp
from shared.tools.mcp import provider
from shared.tools.mcp.connection import MCPConnection
from shared.tools.mcp.tool import schema_problem
from shared.tools.registry import ToolRegistry
from tests.shared.tools.conftest import call, tool_settings
from tests.support.processes import ROOT

TYPO = {"type": "object", "properties": {"path": {"type": "strin"}}}  # no such type
SCALAR = {"type": "string"}  # (this SDK's servers refuse to list it; others send it)
GOOD = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


@pytest.fixture(autouse=True)
def close_sessions() -> Iterator[None]:
    yield
    mcp.shutdown()


def skipped(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is not offered to the model" in r.getMessage()]


def test_a_server_listing_a_bad_schema_keeps_its_other_tools(workspace: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = {"command": sys.executable, "args": ["-m", "tests.support.mcp_named_server"], "cwd": str(ROOT),
              "env": {"MCP_LABEL": "S", "MCP_TOOL_NAMES": "good,typo",
                      "MCP_TOOL_SCHEMAS": json.dumps({"good": GOOD, "typo": TYPO})}}
    settings = tool_settings(workspace, allowed=["mcp_*"], granted=[], mcp_servers={"s": server})
    with caplog.at_level(logging.WARNING):
        reg = build_registry(settings)
    offered = [spec["function"] for spec in reg.specs()]
    assert [f["name"] for f in offered] == ["mcp_s_good"]
    assert offered[0]["parameters"] == GOOD
    assert call(reg, "mcp_s_good", {"path": "x"}).output == "S good"
    assert not call(reg, "mcp_s_typo", {}).ok
    assert skipped(caplog) == [
        "MCP server 's' tool 'typo' is not offered to the model: its input schema is not valid JSON Schema "
        "('strin' is not valid under any of the given schemas, at properties/path/type)",
    ]


def _listed(schema: dict[str, Any]) -> MCPConnection:
    """A connection as it is once its server listed tool `t` with `schema` (never started)."""
    config = load_settings(tools={"mcp_servers": {"s": {"command": "true"}}}).tools.mcp_servers["s"]
    conn = MCPConnection("s", config, connect_timeout=1, health_interval=1)
    conn.tools = {"t": mcp_types.Tool(name="t", input_schema=schema)}
    return conn


def test_a_tool_whose_schema_goes_bad_is_withdrawn_and_warned_of_once(workspace: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    reg = ToolRegistry(tool_settings(workspace, allowed=["mcp_*"], granted=[]), [])
    add = provider._adder(reg, ["s"])
    add(_listed(GOOD))
    assert "mcp_s_t" in reg.names()
    with caplog.at_level(logging.WARNING):
        add(_listed(SCALAR))
        add(_listed(SCALAR))  # listed again by the next health check: nothing new to say
    assert "mcp_s_t" not in reg.names()
    assert skipped(caplog) == ["MCP server 's' tool 't' is not offered to the model: "
                               "its input schema's type is 'string', not 'object'"]
    add(_listed(GOOD))  # mended
    assert "mcp_s_t" in reg.names()


@pytest.mark.parametrize("schema", [
    {"type": "object"},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "additionalProperties": False},
    {"type": "object", "$defs": {"p": {"type": "string"}}, "properties": {"p": {"$ref": "#/$defs/p"}}},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
     "definitions": {"p": {"type": "string"}}, "properties": {"p": {"$ref": "#/definitions/p"}}},
])
def test_ordinary_schemas_pass(schema: dict[str, Any]) -> None:
    assert schema_problem(schema) is None


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": []},
    {"type": "object", "required": "path"},
    {"type": ["object", "null"]},
    {"type": "object", "$schema": {"x": 1}},  # which the checker itself raised on, taking the server's tools down
    {"type": "object", "$schema": 5},
])
def test_schemas_an_api_refuses_are_caught(schema: dict[str, Any]) -> None:
    assert schema_problem(schema) is not None
