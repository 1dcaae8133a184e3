"""`read_file`: a text file of the workspace, whole or a range of lines."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from shared.settings import Permission
from shared.skills import builtin_file
from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult
from shared.tools.workspace import OutsideWorkspace, display, resolve

MAX_CHARS = 50_000
MAX_FILE_BYTES = 20_000_000


class ReadFileArgs(BaseModel):
    path: str = Field(min_length=1, description="File path, relative to the workspace")
    start_line: int | None = Field(default=None, ge=1, description="First line to return (1-based)")
    end_line: int | None = Field(default=None, ge=1, description="Last line to return (inclusive)")


def _locate(ctx: ToolContext, path: str) -> Path:
    """The workspace file, or a built-in skill file served under the same `skills/...` path."""
    target = resolve(ctx.workspace, path)
    if not target.exists():
        builtin = builtin_file(display(ctx.workspace, target))
        if builtin is not None:
            return builtin
    return target


def select_lines(text: str, start: int | None, end: int | None) -> str:
    """Lines start..end (1-based, inclusive) of text; the whole text when neither is given."""
    if start is None and end is None:
        return text
    lines = text.splitlines(keepends=True)
    first = (start or 1) - 1
    return "".join(lines[first:end])


def _clip(text: str, total_lines: int) -> str:
    if len(text) <= MAX_CHARS:
        return text
    return (text[:MAX_CHARS] + f"\n[truncated at {MAX_CHARS} characters; the file has {total_lines} lines: "
            "read further with start_line and end_line]")


class ReadFileTool(Tool):
    name = "read_file"
    description = ("Read a text file from the workspace. Optionally only lines start_line..end_line "
                   "(1-based, inclusive). Long files are cut off; page through them with the line range.")
    Args = ReadFileArgs
    group = "files"
    permissions = frozenset({Permission.FS_READ})
    idempotent = True
    timeout = 30.0

    async def run(self, args: ReadFileArgs, ctx: ToolContext) -> ToolResult:
        try:
            target = _locate(ctx, args.path)
        except OutsideWorkspace as err:
            return err.result()
        if not target.exists():
            return ToolResult.fail(ErrorCode.NOT_FOUND, f"no such file: {args.path}")
        if not target.is_file():
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"not a file: {args.path} (use list_dir for folders)")
        if target.stat().st_size > MAX_FILE_BYTES:
            return ToolResult.fail(ErrorCode.TOO_LARGE, f"{args.path} is larger than {MAX_FILE_BYTES} bytes")
        if args.start_line and args.end_line and args.end_line < args.start_line:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, "end_line must not be before start_line")
        data = target.read_bytes()
        if b"\x00" in data[:8192]:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"{args.path} looks like a binary file")
        text = data.decode("utf-8", errors="replace")
        chosen = select_lines(text, args.start_line, args.end_line)
        return ToolResult.success(_clip(chosen, text.count("\n") + 1))
