"""`write_file`: create, overwrite or append to a workspace file (parent folders are created)."""

from __future__ import annotations

import os
import pwd

from pydantic import BaseModel, Field

from shared.settings import Permission, Settings
from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult
from shared.tools.registry import is_allowed
from shared.tools.workspace import NotAFile, OutsideWorkspace, display, open_file, resolve


class WriteFileArgs(BaseModel):
    path: str = Field(min_length=1, description="File path, relative to the workspace")
    content: str = Field(description="Text to write")
    append: bool = Field(default=False, description="Append to the file instead of replacing it")


def commands_owner(settings: Settings) -> tuple[int, int] | None:
    """(uid, gid) of the user exec's commands run as, when that is not the worker's (a root worker
    drops to NANOFLEET_TOOLS__EXEC__RUN_AS_USER) and exec may run here: what write_file makes is
    theirs, so a command can change or add to it (write a script, then run it)."""
    name = settings.tools.exec.run_as_user
    if (os.geteuid() != 0 or not name or not is_allowed("exec", settings.tools.allowed)
            or Permission.SHELL not in settings.permissions.granted):
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


class WriteFileTool(Tool):
    name = "write_file"
    description = ("Write text to a file in the workspace, replacing it (or appending with append=true). "
                   "Missing parent folders are created.")
    Args = WriteFileArgs
    group = "files"
    permissions = frozenset({Permission.FS_WRITE})
    max_input_bytes = 1_000_000
    timeout = 30.0

    async def run(self, args: WriteFileArgs, ctx: ToolContext) -> ToolResult:
        data = args.content.encode()
        if args.path.endswith(("/", "\\")):  # a folder's name: it would become a file of that name
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"{args.path} names a folder: give a file name in it")
        try:
            target = resolve(ctx.workspace, args.path)
            if target == ctx.workspace.resolve():
                return ToolResult.fail(ErrorCode.INVALID_ARGS, "give a file name, not the workspace itself")
            with open_file(ctx.workspace, target, "ab" if args.append else "wb", make_parents=True,
                           protected=ctx.settings.tools.protected_files, owner=commands_owner(ctx.settings)) as fh:
                fh.write(data)
        except OutsideWorkspace as err:
            return err.result()
        except NotAFile as err:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"{args.path} {err}")
        except OSError as err:
            return ToolResult.fail(ErrorCode.FAILED, f"cannot write {args.path}: {err.strerror or err}")
        verb = "appended" if args.append else "wrote"
        return ToolResult.success(f"{verb} {len(data)} bytes to {display(ctx.workspace, target)}")
