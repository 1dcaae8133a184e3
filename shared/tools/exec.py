"""`exec`: a shell command in the workspace, in its own process group, with a timeout that kills
the whole group (as does the end of its run: `/stop`, a cancel), capped output, a minimal
environment and, under root, an unprivileged user.
While calls run the worker is a child subreaper (Linux), so what a command leaves behind, even
through `setsid`, is reparented to the worker, then found, killed and reaped when the call ends."""

from __future__ import annotations

import asyncio
import codecs
import collections
import contextlib
import logging
import os
import pwd
import secrets
import signal
import stat
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, Field

from shared.process_guard import libc
from shared.settings import Permission, Settings
from shared.tools.base import Emit, ErrorCode, Tool, ToolContext, ToolResult
from shared.tools.run_watch import run_ended
from shared.tools.shell_guard import Denied, check_command
from shared.tools.workspace import OutsideWorkspace, resolve

log = logging.getLogger(__name__)
SHELL = "/bin/sh"
POLL = 0.05  # seconds between looks at the exit status (Process.wait() would also wait for pipe EOF)
READ_GRACE = 2.0  # seconds to drain the pipe after the group is killed
PROGRESS_INTERVAL = 0.5  # at most one progress event per this many seconds
PROGRESS_LINES = 50
PROGRESS_LINE_CHARS = 500
MARKER = "EXEC_CALL_ID"  # a token per call in the command's environment (not NANOFLEET_*: those are settings)
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
KILL_ROUNDS = 20  # rescans for processes forked while the others were being stopped
TIMED_OUT = "timed out"  # why run_command killed a command, unless its run ended (then how it did)


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
        *lines, partial = (self.partial + text).split("\n")
        self.partial = partial[:PROGRESS_LINE_CHARS]  # only this much is shown: do not hold (or re-join) more
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


def _set_subreaper(on: bool) -> bool:
    c = libc()
    if c is None or c.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        if on:
            log.warning("exec: cannot make the worker a child subreaper; processes that leave a command's "
                        "session are looked for among all processes by their marker")
        return False
    return True


class Calls:
    """The exec calls running in this process: their markers and shells, and the subreaper switch.

    The worker is a subreaper only while a call runs, so that at other times orphans of other
    children (an MCP server's, say) still go to init, which reaps them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.shells: dict[str, int] = {}  # marker token -> shell pid (0 until started)
        self.subreaper = False

    def start(self, token: str) -> bool:
        """Register a call; whether the worker is now a subreaper (its orphans come to us)."""
        with self.lock:
            if not self.shells:
                self.subreaper = _set_subreaper(True)
            self.shells[token] = 0
            return self.subreaper

    def started(self, token: str, pid: int) -> None:
        with self.lock:
            self.shells[token] = pid

    def end(self, token: str) -> None:
        with self.lock:
            self.shells.pop(token, None)
            if not self.shells and self.subreaper:
                self.subreaper = not _set_subreaper(False)

    def others(self) -> tuple[set[str], set[int]]:
        """The tokens and shell pids of every running call."""
        with self.lock:
            return set(self.shells), set(self.shells.values())


CALLS = Calls()


@dataclass(frozen=True)
class Leftovers:
    """How to recognise one call's processes."""

    shell: int
    token: str
    exec_uid: int | None  # the unprivileged user's uid when it is not the worker's own
    in_tree: bool  # the worker is a subreaper: everything of the call is among its descendants
    started: psutil.Process | None = None  # the shell as started (pid and start time): below it, all is ours

    def owns(self, proc: psutil.Process) -> bool:
        """In the shell's session or group, carrying this call's marker, or (among the worker's own
        descendants) running as the exec user without a running call's marker."""
        try:
            if self.shell in (proc.pid, os.getsid(proc.pid), os.getpgid(proc.pid)):
                return True
            uid = proc.uids().real
        except (OSError, psutil.Error):
            return False
        try:
            marker = proc.environ().get(MARKER)
        except psutil.Error:  # a zombie has no environment left
            marker = None
        if marker == self.token:
            return True
        tokens, shells = CALLS.others()
        return self.in_tree and uid == self.exec_uid and marker not in tokens and proc.pid not in shells


def _below(table: dict[int, psutil.Process], root: int) -> set[int]:
    """The pids under `root`, by the parent links read into `table`. A process that is gone by now
    still links its children here (psutil's children() drops them with it: they would go unseen)."""
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for pid, proc in table.items():
        kids[proc.info["ppid"]].append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for pid in kids.pop(stack.pop(), []):
            found.add(pid)
            stack.append(pid)
    return found


def _call_processes(leftovers: Leftovers) -> list[psutil.Process]:
    """The call's processes now: those below its shell while the shell is still the one started,
    and those `owns` recognises (among the worker's descendants when it is a subreaper)."""
    table = {proc.pid: proc for proc in psutil.process_iter(["ppid"])}
    started = leftovers.started  # is_running() compares the start time too: the pid may be another's by now
    below_shell = _below(table, leftovers.shell) if started is not None and started.is_running() else set()
    pool = _below(table, os.getpid()) if leftovers.in_tree else set(table)
    return [table[pid] for pid in pool if pid in below_shell or leftovers.owns(table[pid])]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_call(leftovers: Leftovers) -> list[psutil.Process]:
    """SIGKILL every process of the call once all are stopped, round by round, so that none can fork
    a new one meanwhile. The shell's group is stopped first, not killed: asyncio reaps a dead shell
    at once, and the links by which what the shell started is found would go with it. Returns those
    to reap (all but the shell, which asyncio waits for)."""
    _signal_group(leftovers.shell, signal.SIGSTOP)
    stopped: set[psutil.Process] = set()
    for _ in range(KILL_ROUNDS):
        found = {p for p in _call_processes(leftovers) if p not in stopped}
        if not found:
            break
        for proc in found:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGSTOP)
        stopped |= found
    _signal_group(leftovers.shell, signal.SIGKILL)
    for proc in stopped:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return [p for p in stopped if p.pid != leftovers.shell]


async def _exited(proc: asyncio.subprocess.Process, timeout: float,
                  run_end: asyncio.Task[str] | None) -> str | None:
    """None once the command exited; else why it is to be killed: TIMED_OUT, or how its run ended."""
    deadline = time.monotonic() + timeout
    while proc.returncode is None:
        if run_end is not None and run_end.done():
            return run_end.result()
        if time.monotonic() >= deadline:
            return TIMED_OUT
        await asyncio.sleep(POLL)
    return None


def _reap(orphans: list[psutil.Process]) -> threading.Thread:
    """Wait for the killed processes in a thread: reparented to the worker, they are its children
    now, and stay zombies until it waits for them."""
    thread = threading.Thread(target=psutil.wait_procs, args=(orphans,), kwargs={"timeout": READ_GRACE},
                              name="exec-reaper", daemon=True)
    thread.start()
    return thread


async def run_command(argv: list[str], *, cwd: Path, env: dict[str, str], who: RunAs | None, timeout: float,
                      output: Output, progress: Progress,
                      watch: Callable[[], Coroutine[Any, Any, str]] | None = None) -> tuple[int | None, str | None]:
    """Run to completion, timeout or the end of `watch` (which returns once the run ended, saying how);
    (exit code, why it was killed: TIMED_OUT, `watch`'s answer or None). Nothing of the command
    outlives this."""
    ids: dict[str, Any] = {"user": who.uid, "group": who.gid, "extra_groups": []} if who else {}
    token = secrets.token_hex(16)
    in_tree = CALLS.start(token)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, cwd=cwd, env={**env, MARKER: token}, start_new_session=True, **ids)
        CALLS.started(token, proc.pid)
        started: psutil.Process | None = None
        with contextlib.suppress(psutil.Error):  # already exited and reaped
            started = psutil.Process(proc.pid)
        assert proc.stdout is not None
        pump = asyncio.create_task(_pump(proc.stdout, output, progress))
        run_end = asyncio.create_task(watch()) if watch else None
        try:
            killed = await _exited(proc, timeout, run_end)
        finally:  # also when the call itself is cancelled
            if run_end is not None:
                run_end.cancel()
            exec_uid = who.uid if who and who.uid != os.geteuid() else None
            reaper = _reap(kill_call(Leftovers(proc.pid, token, exec_uid, in_tree, started)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(pump), READ_GRACE)
        pump.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), READ_GRACE)
        await asyncio.to_thread(reaper.join)
    finally:
        CALLS.end(token)
    progress.flush(final=True)
    return proc.returncode, killed


class ExecTool(Tool):
    name = "exec"
    description = ("Run a shell command in the workspace and return its output (stdout and stderr) and exit "
                   "code. Destructive commands are refused; long output is cut in the middle.")
    Args = ExecArgs
    group = "shell"
    permissions = frozenset({Permission.SHELL})
    timeout = 3600.0  # the outer bound only: each call is limited by its own timeout (<= max_timeout)
    watches_run = True  # it kills the command's processes and keeps the output so far
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
        try:
            if not cwd.is_dir():
                return ToolResult.fail(ErrorCode.NOT_FOUND, f"working_dir is not a folder: {args.working_dir}")
        except OSError as err:  # a path too long to use, which an earlier write_file could make
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"working_dir cannot be used: {err.strerror or err}")
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
        # A call outside a run (a test, a script) has nothing to watch
        watch = (lambda: run_ended(ctx.settings.database_url, ctx.run_id)) if ctx.run_id else None
        code, killed = await run_command(
            [SHELL, "-c", args.command], cwd=cwd, env=minimal_env(ctx.settings), who=who, timeout=timeout,
            output=output, progress=Progress(ctx.emit, ctx.call_id), watch=watch)
        text = output.render() or "(no output)"
        if killed == TIMED_OUT:
            return ToolResult.fail(ErrorCode.TIMEOUT, f"the command did not finish within {timeout} s and was "
                                   f"killed with all its processes; output so far:\n{text}")
        if killed:  # not retryable: nobody waits for the result of a run that ended
            return ToolResult.fail(ErrorCode.FAILED, f"stopped: the run {killed} while this command ran; it was "
                                   f"killed with all its processes; output so far:\n{text}")
        return ToolResult.success(f"{text.rstrip()}\n[exit code: {code}]")
