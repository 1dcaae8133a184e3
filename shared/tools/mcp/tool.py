"""An MCP server's tool as a nanofleet Tool: `mcp_<server>_<tool>`, group `mcp`, with the server's
input schema passed through as the JSON schema the model sees (the server validates arguments),
once it is checked: one the model's API would refuse would fail every request that offered it."""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any, ClassVar

import mcp_types
from jsonschema import Draft202012Validator, SchemaError, validators
from pydantic import BaseModel, ConfigDict, create_model

from shared.tools.base import Tool, ToolContext, ToolResult
from shared.tools.mcp.connection import MCPConnection

MAX_NAME = 64  # what function-calling APIs accept
MAX_DESCRIPTION = 1024
UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class MCPArgs(BaseModel):
    """Any JSON object; the schema shown to the model is the server's own."""

    model_config = ConfigDict(extra="allow")
    input_schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return copy.deepcopy(cls.input_schema)


class MCPTool(Tool):
    """Calls `remote_name` on its server's persistent session."""

    group = "mcp"
    Args = MCPArgs
    server: ClassVar[str]
    remote_name: ClassVar[str]
    max_output_bytes = 200_000

    def __init__(self, connection: MCPConnection) -> None:
        self.connection = connection

    async def run(self, args: MCPArgs, ctx: ToolContext) -> ToolResult:
        return await self.connection.call(self.remote_name, args.model_dump())


def tool_name(server: str, tool: str) -> str:
    """`mcp_<server>_<tool>` with unsafe characters replaced, shortened with a hash if too long."""
    name = UNSAFE.sub("_", f"mcp_{server}_{tool}")
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:MAX_NAME - 9]}_{digest}"


def input_schema(spec: mcp_types.Tool) -> dict[str, Any]:
    schema = copy.deepcopy(spec.input_schema) if isinstance(spec.input_schema, dict) else {}
    schema.pop("title", None)
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why the model's API would refuse `schema` as a tool's parameters (function calling takes an
    object schema, valid JSON Schema), or None."""
    if schema.get("type") != "object":
        return f"its input schema's type is {schema.get('type')!r}, not 'object'"
    try:
        validators.validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as err:
        where = "/".join(str(part) for part in err.absolute_path) or "the top"
        return f"its input schema is not valid JSON Schema ({err.message[:200]}, at {where})"
    except Exception as err:  # what the checker itself cannot take ($schema not a string...)
        return f"its input schema cannot be checked ({type(err).__name__}: {str(err)[:200]})"
    return None


def make_tool(connection: MCPConnection, spec: mcp_types.Tool) -> MCPTool:
    """A Tool class for one listed MCP tool (class attributes are the Tool contract), instantiated."""
    name = tool_name(connection.name, spec.name)
    args = create_model(f"Args_{name}", __base__=MCPArgs)
    args.input_schema = input_schema(spec)
    about = spec.description or spec.title or spec.name
    attrs = {
        "name": name,
        "description": f"[MCP server {connection.name}] {about}"[:MAX_DESCRIPTION],
        "Args": args,
        "server": connection.name,
        "remote_name": spec.name,
        "timeout": connection.config.timeout + 5,  # the call's own timeout fires first
    }
    cls: type[MCPTool] = type(f"MCPTool_{name}", (MCPTool,), attrs)
    return cls(connection)
