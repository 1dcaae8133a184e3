"""`list_dir`: the entries of a workspace folder, optionally recursive and filtered, bounded."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path

from pydantic import BaseModel, Field

from shared.settings import Permission
from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult
from shared.tools.workspace import OutsideWorkspace, open_folder, resolve

SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv", ".mypy_cache"}
MAX_SCAN = 50_000  # entries looked at before the count of those not shown stops


class ListDirArgs(BaseModel):
    path: str = Field(default=".", description="Folder path, relative to the workspace")
    recursive: bool = Field(default=False, description="Include the contents of sub-folders")
    pattern: str | None = Field(default=None, description="Glob on the entry name, e.g. *.md")
    max_entries: int = Field(default=200, ge=1, le=2000, description="Most entries to return")


def _entries(folder: int, recursive: bool) -> Iterator[tuple[str, bool]]:
    """(path relative to the folder fd, is a folder), sorted, without following symlinked folders."""
    if not recursive:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            yield entry.name, entry.is_dir(follow_symlinks=False)
        return
    for current, dirs, files, fd in os.fwalk(".", dir_fd=folder):  # by fd: a swapped folder is not followed
        links = [d for d in dirs if _is_link(d, fd)]  # listed as fwalk found them: a link to a folder is no folder here
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and d not in links)
        rel = Path(current)
        for name in dirs:
            yield str(rel / name), True
        for name in sorted([*files, *links]):
            yield str(rel / name), False


def _is_link(name: str, folder: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:  # gone meanwhile
        return False


def format_listing(entries: Iterator[tuple[str, bool]], pattern: str | None, limit: int) -> str:
    """One line per entry (folders end with '/'), at most `limit`, with a note on what was left out."""
    lines: list[str] = []
    extra = 0
    for n, (rel, is_dir) in enumerate(entries):
        if n >= MAX_SCAN:
            return "\n".join([*lines, f"[stopped after {MAX_SCAN} entries: narrow with path or pattern]"])
        if pattern and not fnmatch(Path(rel).name, pattern):
            continue
        if len(lines) < limit:
            lines.append(rel + ("/" if is_dir else ""))
        else:
            extra += 1
    if not lines:
        return f"(no entries match {pattern})" if pattern else "(no entries)"
    if extra:
        lines.append(f"[{extra} more entries not shown: narrow with path or pattern]")
    return "\n".join(lines)


class ListDirTool(Tool):
    name = "list_dir"
    description = ("List a workspace folder: one entry per line, folders end with '/'. Optionally recursive "
                   "and filtered by a glob pattern on names; the output is bounded by max_entries.")
    Args = ListDirArgs
    group = "files"
    permissions = frozenset({Permission.FS_READ})
    idempotent = True
    timeout = 30.0

    async def run(self, args: ListDirArgs, ctx: ToolContext) -> ToolResult:
        try:
            target = resolve(ctx.workspace, args.path)
        except OutsideWorkspace as err:
            return err.result()
        try:
            if not target.exists():
                return ToolResult.fail(ErrorCode.NOT_FOUND, f"no such folder: {args.path}")
            if not target.is_dir():
                return ToolResult.fail(ErrorCode.INVALID_ARGS, f"not a folder: {args.path} (use read_file)")
            folder = open_folder(ctx.workspace, target)
        except OutsideWorkspace as err:
            return err.result()
        except OSError as err:
            return ToolResult.fail(ErrorCode.FAILED, f"cannot list {args.path}: {err.strerror or err}")
        try:
            return ToolResult.success(format_listing(_entries(folder, args.recursive), args.pattern,
                                                     args.max_entries))
        finally:
            os.close(folder)
