"""`read_file`: a text file of the workspace, whole or a range of lines."""

from __future__ import annotations

import os
from typing import BinaryIO

from pydantic import BaseModel, Field

from shared.settings import Permission
from shared.skills import builtin_file
from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult
from shared.tools.workspace import NotAFile, OutsideWorkspace, display, open_file, resolve

MAX_BYTES = 60_000  # of the text returned, in UTF-8: with its note, within the output cap
MAX_FILE_BYTES = 20_000_000


class ReadFileArgs(BaseModel):
    path: str = Field(min_length=1, description="File path, relative to the workspace")
    start_line: int | None = Field(default=None, ge=1, description="First line to return (1-based)")
    end_line: int | None = Field(default=None, ge=1, description="Last line to return (inclusive)")


def _load(ctx: ToolContext, path: str) -> bytes | ToolResult:
    """The file's bytes: from the workspace, else a built-in skill file served under the same
    `skills/...` path; or the failure to answer with."""
    try:
        target = resolve(ctx.workspace, path)
    except OutsideWorkspace as err:
        return err.result()
    try:
        with open_file(ctx.workspace, target, "rb") as fh:
            return _read_capped(fh, path)
    except OutsideWorkspace as err:
        return err.result()
    except (FileNotFoundError, NotADirectoryError):
        builtin = builtin_file(display(ctx.workspace, target))
        if builtin is None:
            return ToolResult.fail(ErrorCode.NOT_FOUND, f"no such file: {path}")
        return builtin.read_bytes()
    except NotAFile:
        return ToolResult.fail(ErrorCode.INVALID_ARGS, f"not a file: {path} (use list_dir for folders)")
    except OSError as err:
        return ToolResult.fail(ErrorCode.FAILED, f"cannot read {path}: {err.strerror or err}")


def _read_capped(fh: BinaryIO, path: str) -> bytes | ToolResult:
    if os.fstat(fh.fileno()).st_size > MAX_FILE_BYTES:
        return ToolResult.fail(ErrorCode.TOO_LARGE, f"{path} is larger than {MAX_FILE_BYTES} bytes")
    return fh.read(MAX_FILE_BYTES + 1)[:MAX_FILE_BYTES]


def select_lines(text: str, start: int | None, end: int | None) -> str:
    """Lines start..end (1-based, inclusive) of text; the whole text when neither is given."""
    if start is None and end is None:
        return text
    lines = text.splitlines(keepends=True)
    first = (start or 1) - 1
    return "".join(lines[first:end])


def _clip(text: str, first_line: int, total_lines: int) -> str:
    """The text, or as many whole lines of it as fit MAX_BYTES of UTF-8, with the line to read on from
    (a byte cap: Cyrillic or CJK text is two or three bytes a character, and the tool's output cap,
    which cuts without that hint, counts bytes)."""
    data = text.encode()
    if len(data) <= MAX_BYTES:
        return text
    kept = data[:MAX_BYTES].decode(errors="ignore")
    whole = kept[: kept.rfind("\n") + 1]
    if not whole:  # one line longer than the budget
        return (kept + f"\n[line {first_line} is cut off at {MAX_BYTES:,} bytes; the file has {total_lines} lines: "
                f"read on with start_line={first_line + 1}]")
    last = first_line + whole.count("\n") - 1
    return whole + f"[cut off after line {last} of {total_lines}: read on with start_line={last + 1}]"


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
        if args.start_line and args.end_line and args.end_line < args.start_line:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, "end_line must not be before start_line")
        data = _load(ctx, args.path)
        if isinstance(data, ToolResult):
            return data
        if b"\x00" in data[:8192]:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"{args.path} looks like a binary file")
        text = data.decode("utf-8", errors="replace")
        total = len(text.splitlines())  # select_lines' count: a last newline starts no line
        if args.start_line and args.start_line > max(total, 1):  # line 1 of an empty file is just empty
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"start_line {args.start_line} is past the end: "
                                   f"{args.path} has {total} line{'' if total == 1 else 's'}")
        chosen = select_lines(text, args.start_line, args.end_line)
        return ToolResult.success(_clip(chosen, args.start_line or 1, total))
