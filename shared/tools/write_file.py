"""`write_file`: create, overwrite or append to a workspace file (parent folders are created)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.settings import Permission
from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult
from shared.tools.workspace import NotAFile, OutsideWorkspace, display, open_file, resolve


class WriteFileArgs(BaseModel):
    path: str = Field(min_length=1, description="File path, relative to the workspace")
    content: str = Field(description="Text to write")
    append: bool = Field(default=False, description="Append to the file instead of replacing it")


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
                           protected=ctx.settings.tools.protected_files) as fh:
                fh.write(data)
        except OutsideWorkspace as err:
            return err.result()
        except NotAFile as err:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"{args.path} {err}")
        except OSError as err:
            return ToolResult.fail(ErrorCode.FAILED, f"cannot write {args.path}: {err.strerror or err}")
        verb = "appended" if args.append else "wrote"
        return ToolResult.success(f"{verb} {len(data)} bytes to {display(ctx.workspace, target)}")
