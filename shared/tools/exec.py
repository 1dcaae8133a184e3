"""`exec`: a shell command in the workspace, in its own process group, with a timeout that kills
the whole group, capped output, a minimal environment and, under root, an unprivileged user."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
import pwd
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, Field

from shared.settings import Permission, Settings
from shared.tools.base import Emit, ErrorCode, Tool, ToolContext, ToolResult
from shared.tools.shell_guard import Denied, check_command
from shared.tools.workspace import OutsideWorkspace, resolve

log = logging.getLogger(__name__)
SHELL = "/bin/sh"
POLL = 0.05  # seconds between looks at the exit status (Process.wait() would also wait for pipe EOF)
READ_GRACE = 2.0  # seconds to drain the pipe after the group is killed
PROGRESS_INTERVAL = 0.5  # at most one progress event per this many seconds
PROGRESS_LINES = 50
PROGRESS_LINE_CHARS = 500


class ExecArgs(BaseModel):
    command: str = Field(min_length=1, max_length=20_000, description="Shell command (run by /bin/sh -c)")
    working_dir: str | None = Field(default=None, description="Folder to run in, relative to the workspace")
    timeout: int | None = Field(default=None, ge=1, description="Seconds before the command is killed")


@dataclass(frozen=True)
class RunAs:
    """The unprivileged account commands run as when the worker is root."""

    name: str
    uid: int
    gid: int


def run_as(settings: Settings) -> RunAs | None:
    """The account to drop to: only when the worker is root and the configured user exists."""
    name = settings.tools.exec.run_as_user
    if os.geteuid() != 0 or not name:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        log.warning("exec runs as root: NANOFLEET_TOOLS__EXEC__RUN_AS_USER=%s does not exist here", name)
        return None
    return RunAs(name, entry.pw_uid, entry.pw_gid)


def _allows(st: os.stat_result, who: RunAs, need: int) -> bool:
    """Whether `who` has the rwx bits in `need` (given as the owner's bits) on a file with this stat."""
    if st.st_uid == who.uid:
        return st.st_mode & need == need
    if st.st_gid == who.gid:
        return st.st_mode & (need >> 3) == need >> 3
    return st.st_mode & (need >> 6) == need >> 6


def inaccessible(folder: Path, who: RunAs) -> Path | None:
    """The first folder on the way to `folder` that `who` cannot enter (or `folder`, if not writable)."""
    for part in reversed(folder.parents):
        if not _allows(part.stat(), who, stat.S_IXUSR):
            return part
    return None if _allows(folder.stat(), who, stat.S_IRWXU) else folder


def minimal_env(settings: Settings) -> dict[str, str]:
    """PATH, HOME and LANG, plus the variables the operator listed: never the worker's own secrets."""
    extra = {k: v.get_secret_value() for k, v in settings.tools.exec.env.items()}
    return {**extra, "PATH": settings.tools.exec.path, "HOME": str(settings.workspace), "LANG": "C.UTF-8"}


class Output:
    """The head and tail of a stream, at most `limit` characters in all, and how much was left out."""

    def __init__(self, limit: int) -> None:
        self.limit, self.half = limit, limit // 2
        self.head = self.tail = ""
        self.total = 0

    def add(self, text: str) -> None:
        self.total += len(text)
        if len(self.head) < self.half:
            room = self.half - len(self.head)
            self.head, text = self.head + text[:room], text[room:]
        if text:
            self.tail = (self.tail + text)[-(self.limit - self.half):]

    def render(self) -> str:
        omitted = self.total - len(self.head) - len(self.tail)
        if omitted <= 0:
            return self.head + self.tail
        return f"{self.head}\n... [{omitted} characters omitted: output is capped at {self.limit}] ...\n{self.tail}"


class Progress:
    """Output lines as `tool.progress` events, batched: at most one event per PROGRESS_INTERVAL."""

    def __init__(self, emit: Emit, call_id: str) -> None:
        self.emit, self.call_id = emit, call_id
        self.partial = ""
        self.pending: list[str] = []
        self.last = time.monotonic()

    def add(self, text: str) -> None:
        *lines, self.partial = (self.partial + text).split("\n")
        self.pending = (self.pending + [line[:PROGRESS_LINE_CHARS] for line in lines])[-PROGRESS_LINES:]
        if self.pending and time.monotonic() - self.last >= PROGRESS_INTERVAL:
            self.flush()

    def flush(self, final: bool = False) -> None:
        if final and self.partial:
            self.pending.append(self.partial[:PROGRESS_LINE_CHARS])
            self.partial = ""
        if self.pending:
            self.emit("tool.progress", {"call_id": self.call_id, "tool": "exec", "lines": self.pending})
        self.pending, self.last = [], time.monotonic()


async def _pump(stream: asyncio.StreamReader, output: Output, progress: Progress) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := await stream.read(4096):
        text = decoder.decode(chunk)
        output.add(text)
        progress.add(text)
    output.add(decoder.decode(b"", final=True))


def kill_tree(pid: int) -> None:
    """SIGKILL the command's process group and every descendant still reachable from it."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for child in descendants:  # those that left the group with setsid
        with contextlib.suppress(psutil.Error):
            child.kill()


async def _exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while proc.returncode is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL)
    return True


async def run_command(argv: list[str], *, cwd: Path, env: dict[str, str], who: RunAs | None, timeout: float,
                      output: Output, progress: Progress) -> tuple[int | None, bool]:
    """Run to completion or timeout; (exit code, timed out). Nothing of the command outlives this."""
    ids: dict[str, Any] = {"user": who.uid, "group": who.gid, "extra_groups": []} if who else {}
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        cwd=cwd, env=env, start_new_session=True, **ids)
    assert proc.stdout is not None
    pump = asyncio.create_task(_pump(proc.stdout, output, progress))
    try:
        finished = await _exited(proc, timeout)
    finally:  # also when the call itself is cancelled
        kill_tree(proc.pid)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(pump), READ_GRACE)
    pump.cancel()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), READ_GRACE)
    progress.flush(final=True)
    return proc.returncode, not finished


class ExecTool(Tool):
    name = "exec"
    description = ("Run a shell command in the workspace and return its output (stdout and stderr) and exit "
                   "code. Destructive commands are refused; long output is cut in the middle.")
    Args = ExecArgs
    group = "shell"
    permissions = frozenset({Permission.SHELL})
    timeout = 3600.0  # the outer bound only: each call is limited by its own timeout (<= max_timeout)
    max_output_bytes = 400_000

    async def run(self, args: ExecArgs, ctx: ToolContext) -> ToolResult:
        try:
            check_command(args.command)
            cwd = resolve(ctx.workspace, args.working_dir or ".")
        except Denied as err:
            return ToolResult.fail(ErrorCode.PERMISSION_DENIED, str(err))
        except OutsideWorkspace as err:
            return err.result()
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        if not cwd.is_dir():
            return ToolResult.fail(ErrorCode.NOT_FOUND, f"working_dir is not a folder: {args.working_dir}")
        who = run_as(ctx.settings)
        if who and (blocked := inaccessible(cwd, who)):
            return ToolResult.fail(ErrorCode.FAILED, (
                f"exec runs as user '{who.name}', who cannot use {blocked}: give that user access to the "
                "workspace (e.g. chown it) or set NANOFLEET_TOOLS__EXEC__RUN_AS_USER"))
        return await self._run(args, ctx, cwd, who)

    async def _run(self, args: ExecArgs, ctx: ToolContext, cwd: Path, who: RunAs | None) -> ToolResult:
        limits = ctx.settings.tools.exec
        timeout = min(args.timeout or limits.default_timeout, limits.max_timeout)
        output = Output(limits.max_output_chars)
        code, timed_out = await run_command(
            [SHELL, "-c", args.command], cwd=cwd, env=minimal_env(ctx.settings), who=who, timeout=timeout,
            output=output, progress=Progress(ctx.emit, ctx.call_id))
        text = output.render() or "(no output)"
        if timed_out:
            return ToolResult.fail(ErrorCode.TIMEOUT, f"the command did not finish within {timeout} s and was "
                                   f"killed with all its processes; output so far:\n{text}")
        return ToolResult.success(f"{text.rstrip()}\n[exit code: {code}]")
