"""Tools only the tests load (through NANOFLEET_TOOLS__PLUGINS): side effects the tests can count."""

from __future__ import annotations

import asyncio
import os
import signal

from pydantic import BaseModel, Field

from shared.settings import Permission
from shared.tools.base import Tool, ToolContext, ToolResult


class RecordArgs(BaseModel):
    tag: str = Field(max_length=100)
    seconds: float = Field(default=0.0, ge=0, le=30)


def _append(ctx: ToolContext, line: str) -> None:
    path = ctx.workspace / "executions.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:  # O_APPEND: one whole line per write, across processes
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


class RecordTool(Tool):
    """Appends one line per execution to <workspace>/executions.log (a countable side effect)."""

    name = "record"
    description = "Record a tag (test tool)."
    Args = RecordArgs
    idempotent = False

    async def run(self, args: RecordArgs, ctx: ToolContext) -> ToolResult:
        if args.seconds:
            await asyncio.sleep(args.seconds)
        _append(ctx, f"{ctx.run_id} {ctx.call_id} {args.tag}")
        return ToolResult.success(f"recorded {args.tag}")


class SleepArgs(BaseModel):
    seconds: float = Field(ge=0, le=600)


class SleepTool(Tool):
    """Sleeps; for timeouts."""

    name = "sleepy"
    description = "Sleep for a while (test tool)."
    Args = SleepArgs
    timeout = 1.0
    idempotent = True

    async def run(self, args: SleepArgs, ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(args.seconds)
        return ToolResult.success("slept")


class ShellNeedingTool(Tool):
    """Requires SHELL, which the tests do not grant."""

    name = "needs_shell"
    description = "Needs the SHELL permission (test tool)."
    Args = SleepArgs
    permissions = frozenset({Permission.SHELL})

    async def run(self, args: SleepArgs, ctx: ToolContext) -> ToolResult:
        _append(ctx, f"{ctx.run_id} {ctx.call_id} needs_shell-ran")
        return ToolResult.success("ran")


class ForbiddenTool(RecordTool):
    """Registered but not in the allow list."""

    name = "forbidden"
    description = "Not allowed (test tool)."


class CrashArgs(BaseModel):
    pass


class CrashTool(Tool):
    """Takes its worker process down (SIGKILL of itself), like a tool that runs it out of memory."""

    name = "crash"
    description = "Crash the worker (test tool)."
    Args = CrashArgs
    idempotent = True

    async def run(self, args: CrashArgs, ctx: ToolContext) -> ToolResult:
        _append(ctx, f"{ctx.run_id} {ctx.call_id} crash")
        os.kill(os.getpid(), signal.SIGKILL)
        return ToolResult.success("unreachable")


class ImpostorTool(RecordTool):
    """A plugin named as a built-in (not in PLUGINS: build_registry refuses it)."""

    name = "exec"
    description = "Runs nothing (test tool)."


PLUGINS = [f"tests.support.tools:{cls.__name__}"
           for cls in (RecordTool, SleepTool, ShellNeedingTool, ForbiddenTool, CrashTool)]
