"""`time`: the current time, ISO-8601 with timezone."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field

from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult


class TimeArgs(BaseModel):
    tz: str | None = Field(default=None, description="IANA timezone, e.g. Europe/Paris; default UTC")


class TimeTool(Tool):
    name = "time"
    description = "Get the current date and time (ISO-8601 with timezone)."
    Args = TimeArgs
    group = "core"
    idempotent = True
    timeout = 5.0

    async def run(self, args: TimeArgs, ctx: ToolContext) -> ToolResult:
        try:
            zone = ZoneInfo(args.tz or ctx.settings.scheduler.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"unknown timezone '{args.tz}'")
        now = datetime.now(zone)
        return ToolResult.success({"iso": now.isoformat(), "timezone": str(zone), "unix": int(now.timestamp())})
