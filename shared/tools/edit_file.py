"""`edit_file`: replace text in a workspace file; a miss answers with the closest match as a hint."""

from __future__ import annotations

import asyncio
import os
import time
from difflib import SequenceMatcher

from pydantic import BaseModel, Field

from shared.settings import Permission
from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult
from shared.tools.workspace import NotAFile, OutsideWorkspace, display, open_file, resolve

MAX_HINT_LINES = 20_000  # a longer file gets no closest-match hint, only the error
MAX_HINT_NEEDLE = 1_000  # characters: ratio() grows faster than quadratically with the needle
HINT_SECONDS = 2.0  # the search for a hint stops here and offers the best window found so far
MAX_FILE_BYTES = 5_000_000


class EditFileArgs(BaseModel):
    path: str = Field(min_length=1, description="File path, relative to the workspace")
    old_text: str = Field(min_length=1, description="Exact text to find (must occur once unless replace_all)")
    new_text: str = Field(description="Replacement text")
    replace_all: bool = Field(default=False, description="Replace every occurrence")


def closest_match(text: str, needle: str) -> tuple[int, str] | None:
    """(1-based line, snippet) of the window of lines most like `needle`, if anything is similar.

    Bounded (needle size, file lines, a deadline) because a near-miss on a big file is otherwise
    minutes of CPU, and the caller cannot cancel the thread it runs in.
    """
    lines = text.splitlines()
    if not lines or len(lines) > MAX_HINT_LINES or len(needle) > MAX_HINT_NEEDLE:
        return None
    width = max(1, len(needle.splitlines()))
    best: tuple[float, int] = (0.0, 0)
    deadline = time.monotonic() + HINT_SECONDS
    for i in range(max(1, len(lines) - width + 1)):
        if time.monotonic() > deadline:
            break
        window = "\n".join(lines[i:i + width])
        matcher = SequenceMatcher(None, window, needle, autojunk=False)
        if matcher.real_quick_ratio() <= best[0] or matcher.quick_ratio() <= best[0]:
            continue
        ratio = matcher.ratio()
        if ratio > best[0]:
            best = (ratio, i)
    if best[0] < 0.5:
        return None
    return best[1] + 1, "\n".join(lines[best[1]:best[1] + width])


def occurrences(text: str, needle: str) -> int:
    """How often `needle` occurs in `text`, as far as an edit cares: `str.count`, which skips
    overlapping matches, except that a match another overlaps ("aa" in "aaa") counts as two, so an
    edit of it is refused as ambiguous (at C speed: a Python loop over a large file's matches took a second)."""
    count = text.count(needle)
    return 2 if count == 1 and text.find(needle, text.find(needle) + 1) != -1 else count


async def _miss(path: str, text: str, needle: str) -> ToolResult:
    hint = await asyncio.to_thread(closest_match, text, needle)  # CPU-bound: keep the tool loop free
    message = f"old_text was not found in {path}"
    if hint:
        message += f"; the closest match starts at line {hint[0]}:\n{hint[1]}"
    return ToolResult.fail(ErrorCode.NOT_FOUND, message)


class EditFileTool(Tool):
    name = "edit_file"
    description = ("Edit a workspace file by replacing old_text with new_text. old_text must match exactly "
                   "and occur once, unless replace_all is true.")
    Args = EditFileArgs
    group = "files"
    permissions = frozenset({Permission.FS_WRITE})
    max_input_bytes = 1_000_000
    timeout = 30.0

    async def run(self, args: EditFileArgs, ctx: ToolContext) -> ToolResult:
        try:
            target = resolve(ctx.workspace, args.path)
            with open_file(ctx.workspace, target, "r+b", protected=ctx.settings.tools.protected_files) as fh:
                if os.fstat(fh.fileno()).st_size > MAX_FILE_BYTES:
                    return ToolResult.fail(ErrorCode.TOO_LARGE,
                                           f"{args.path} is larger than {MAX_FILE_BYTES} bytes")
                try:
                    text = fh.read().decode("utf-8")
                except UnicodeDecodeError as err:  # written back, every byte not UTF-8 would be lost
                    return ToolResult.fail(ErrorCode.INVALID_ARGS, (
                        f"{args.path} is not UTF-8 text (byte {err.start}): edit_file would change bytes it "
                        "does not replace; rewrite it whole with write_file, or convert it with exec"))
                # replace_all replaces what str.replace finds; a single edit needs a match with no overlapping other
                count = text.count(args.old_text) if args.replace_all else occurrences(text, args.old_text)
                if count == 1 or (count > 1 and args.replace_all):
                    fh.seek(0)  # the same fd that was read: no second open to race against
                    fh.write(text.replace(args.old_text, args.new_text).encode())
                    fh.truncate()
        except OutsideWorkspace as err:
            return err.result()
        except (FileNotFoundError, NotADirectoryError):
            return ToolResult.fail(ErrorCode.NOT_FOUND, f"no such file: {args.path}")
        except NotAFile as err:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"{args.path} is a folder, not a file" if err.is_dir
                                   else f"{args.path} {err}")
        except OSError as err:
            return ToolResult.fail(ErrorCode.FAILED, f"cannot edit {args.path}: {err.strerror or err}")
        if count == 0:
            return await _miss(args.path, text, args.old_text)
        if count > 1 and not args.replace_all:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"old_text occurs {count} times in {args.path}; "
                                   "add surrounding text to make it unique, or set replace_all")
        return ToolResult.success(f"replaced {count} occurrence{'s' if count > 1 else ''} in "
                                  f"{display(ctx.workspace, target)}")
