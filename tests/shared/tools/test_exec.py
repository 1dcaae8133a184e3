"""exec: output and exit code, the timeout that leaves no process behind, the deny list on every
segment, the output cap, a minimal environment, a confined working dir, the unprivileged user."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.tools.base import ErrorCode
from shared.tools.exec import CALLS, MARKER, PROGRESS_LINE_CHARS, Progress
from shared.tools.registry import ToolRegistry
from shared.tools.shell_guard import Denied, check_command
from tests.shared.tools.conftest import call, deep_folder
from tests.support.processes import wait_until


@pytest.fixture
def reg(registry: Callable[..., ToolRegistry]) -> Callable[..., ToolRegistry]:
    """exec allowed and granted, as the current user (the unprivileged-user path has its own tests)."""

    def make(**exec_settings: Any) -> ToolRegistry:
        return registry(allowed=["exec"], granted=["SHELL"], exec={"run_as_user": "", **exec_settings})

    return make


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def describe(pid: int) -> dict[str, object]:
    """What a failure message needs to know of a process that should be gone."""
    try:
        proc = psutil.Process(pid)
        return {"pid": pid, "status": proc.status(), "ppid": proc.ppid(), "sid": os.getsid(pid),
                "pgid": os.getpgid(pid), "uids": proc.uids().real, "cmdline": proc.cmdline(),
                "marked": MARKER in proc.environ()}
    except (psutil.Error, OSError) as err:
        return {"pid": pid, "error": repr(err)}


def test_output_and_exit_code(reg: Callable[..., ToolRegistry]) -> None:
    result = call(reg(), "exec", {"command": "echo out; echo err >&2; exit 3"})
    assert result.ok and result.output == "out\nerr\n[exit code: 3]"
    assert call(reg(), "exec", {"command": "true"}).output == "(no output)\n[exit code: 0]"


def _reap_shell_mid_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Force the interleaving that a busy machine may produce: the process table that the worker walks
    after SIGKILL reached a call's shell was read while the shell lived, and the shell has died and
    been reaped (Python 3.11's asyncio waits for it in a thread) by the time the table is walked.
    psutil's children() reads the table (`_ppid_map`), then opens each process: it drops all below
    the shell. So the test below failed under load: the setsid'ed sh and its child were left alive."""
    real_killpg, real_map, real_iter = os.killpg, psutil._ppid_map, psutil.process_iter
    stale: list[tuple[int, dict[int, int], list[tuple[psutil.Process, dict[str, Any]]]]] = []

    def killpg(pgid: int, sig: int) -> None:
        if sig == signal.SIGKILL and pgid in CALLS.others()[1]:
            stale.append((pgid, real_map(), [(proc, dict(proc.info)) for proc in real_iter(["ppid"])]))
        real_killpg(pgid, sig)

    def read_before_the_kill() -> tuple[dict[int, int], list[tuple[psutil.Process, dict[str, Any]]]]:
        shell, ppids, procs = stale.pop()
        with contextlib.suppress(AssertionError):  # reaped on the event loop (3.12+), it stays a zombie meanwhile
            wait_until(lambda: not psutil.pid_exists(shell), timeout=5, message="the shell to be reaped")
        return ppids, procs

    def ppid_map() -> dict[int, int]:
        return read_before_the_kill()[0] if stale else real_map()

    def process_iter(attrs: list[str] | None = None, ad_value: Any = None) -> Iterator[psutil.Process]:
        if not stale:
            yield from real_iter(attrs, ad_value)
            return
        for proc, info in read_before_the_kill()[1]:
            proc.info = info
            yield proc

    monkeypatch.setattr(os, "killpg", killpg)
    monkeypatch.setattr(psutil, "_ppid_map", ppid_map)
    monkeypatch.setattr(psutil, "process_iter", process_iter)


@pytest.fixture(params=["as scheduled", "shell reaped mid-walk"])
def schedule(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The order the machine runs things in: as it comes, or forced (see `_reap_shell_mid_walk`)."""
    if request.param == "shell reaped mid-walk":
        _reap_shell_mid_walk(monkeypatch)
    return str(request.param)


def test_timeout_kills_the_whole_process_tree(reg: Callable[..., ToolRegistry], schedule: str,
                                              leftover_pids: Callable[..., list[int]]) -> None:
    command = ("echo $$ > shell.pid; sleep 300 & echo $! > child.pid; "
               "setsid sh -c 'sleep 300 & echo $! > grandchild.pid; sleep 300' & echo $! > escaped.pid; sleep 300")
    result = call(reg(), "exec", {"command": command, "timeout": 1})
    assert result.error == ErrorCode.TIMEOUT and "killed" in result.message
    pids = leftover_pids("shell", "child", "escaped", "grandchild")
    try:
        wait_until(lambda: all(gone(pid) for pid in pids), timeout=10, message=f"processes {pids} to be gone")
    except AssertionError as err:  # the message names every pid: say which were left, and how
        raise AssertionError(f"{err}; still there: {[describe(pid) for pid in pids if not gone(pid)]}") from None


def test_background_processes_do_not_outlive_the_command(reg: Callable[..., ToolRegistry], workspace: Path) -> None:
    result = call(reg(), "exec", {"command": "sleep 300 > /dev/null 2>&1 & echo $! > bg.pid; echo started"})
    assert result.ok and result.output.startswith("started")
    pid = int((workspace / "bg.pid").read_text())
    wait_until(lambda: gone(pid), timeout=10, message="the background process to be gone")


def vanished(pid: int) -> bool:
    """Gone and reaped: not even a zombie left."""
    return not psutil.pid_exists(pid)


@pytest.fixture
def leftover_pids(workspace: Path) -> Iterator[Callable[..., list[int]]]:
    """`leftover_pids(*names)`: the pids the command wrote to <name>.pid; whatever is still alive at
    the end of the test is killed, with the group it leads, so that a failing test leaves nothing running."""
    read: list[int] = []

    def pids(*names: str) -> list[int]:
        read.extend(int((workspace / f"{name}.pid").read_text()) for name in names)
        return read

    yield pids
    for pid in read:
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(pid) == pid:  # a setsid'ed one: what it started (unnamed) is in its group
                os.killpg(pid, signal.SIGKILL)
            psutil.Process(pid).kill()


def test_setsid_and_daemonized_processes_do_not_outlive_the_command(
        reg: Callable[..., ToolRegistry], leftover_pids: Callable[..., list[int]]) -> None:
    command = ("setsid sleep 300 >/dev/null 2>&1 & echo $! > setsid.pid; "
               "sh -c 'setsid sleep 300 >/dev/null 2>&1 & echo $! > daemon.pid'; "
               "(sleep 0 & echo $! > quick.pid); echo started")
    result = call(reg(), "exec", {"command": command})
    assert result.ok and result.output.startswith("started")
    pids = leftover_pids("setsid", "daemon", "quick")
    wait_until(lambda: all(vanished(pid) for pid in pids), timeout=10, message=f"processes {pids} to be reaped")


def test_timeout_also_kills_what_left_the_session(reg: Callable[..., ToolRegistry],
                                                   leftover_pids: Callable[..., list[int]]) -> None:
    result = call(reg(), "exec", {"command": "(setsid sleep 300 >/dev/null 2>&1 & echo $! > t.pid); sleep 100",
                                  "timeout": 1})
    assert result.error == ErrorCode.TIMEOUT
    pids = leftover_pids("t")
    wait_until(lambda: all(vanished(pid) for pid in pids), timeout=10, message=f"process {pids} to be reaped")


def test_progress_holds_at_most_one_shown_line_of_an_unended_line() -> None:
    events: list[dict[str, Any]] = []
    progress = Progress(lambda event, data: events.append(data), "c1")
    for _ in range(2_000):  # 8 MB without a newline, in the pipe's 4 KB reads
        progress.add("a" * 4096)
        assert len(progress.partial) <= PROGRESS_LINE_CHARS
    progress.add("b\nnext")
    progress.flush(final=True)
    assert [line for data in events for line in data["lines"]] == ["a" * PROGRESS_LINE_CHARS, "next"]


def test_per_call_timeout_is_capped_by_the_setting(reg: Callable[..., ToolRegistry]) -> None:
    result = call(reg(max_timeout=1), "exec", {"command": "sleep 30", "timeout": 600})
    assert result.error == ErrorCode.TIMEOUT and "within 1 s" in result.message


def test_output_is_capped_with_a_marker(reg: Callable[..., ToolRegistry]) -> None:
    out = call(reg(max_output_chars=1000), "exec", {"command": "seq 1 100000"}).output
    head, _, tail = out.partition("characters omitted")
    assert head.startswith("1\n2\n3\n") and tail.rstrip().endswith("100000\n[exit code: 0]")
    assert len(out) < 1000 + 200


def test_environment_is_minimal(reg: Callable[..., ToolRegistry], monkeypatch: pytest.MonkeyPatch,
                                workspace: Path) -> None:
    monkeypatch.setenv("NANOFLEET_WORKER_SECRET", "do-not-leak-42")
    out = call(reg(env={"GH_TOKEN": "given-on-purpose"}), "exec", {"command": "env"}).output
    names = {line.split("=", 1)[0] for line in out.splitlines() if "=" in line}
    assert "do-not-leak-42" not in out and "NANOFLEET_WORKER_SECRET" not in names
    assert {"PATH", "HOME", "LANG", "GH_TOKEN"} <= names <= {"PATH", "HOME", "LANG", "GH_TOKEN", "PWD", "SHLVL", "_",
                                                             MARKER}
    assert f"HOME={workspace}" in out


def test_working_dir_is_confined(reg: Callable[..., ToolRegistry], workspace: Path) -> None:
    (workspace / "sub").mkdir()
    assert call(reg(), "exec", {"command": "pwd", "working_dir": "sub"}).output.startswith(str(workspace / "sub"))
    assert call(reg(), "exec", {"command": "pwd", "working_dir": "../"}).status == "REJECTED"
    assert call(reg(), "exec", {"command": "pwd", "working_dir": "/tmp"}).status == "REJECTED"
    assert call(reg(), "exec", {"command": "pwd", "working_dir": "nope"}).error == ErrorCode.NOT_FOUND


def test_a_working_dir_too_long_to_use_is_refused_cleanly(reg: Callable[..., ToolRegistry], workspace: Path) -> None:
    """write_file makes folders by descriptor, past PATH_MAX; exec raised (a traceback in the worker's
    log, the workspace's absolute path shown to the model)."""
    deep = deep_folder(workspace)
    result = call(reg(), "exec", {"command": "pwd", "working_dir": deep})
    assert result.error == ErrorCode.INVALID_ARGS and "too long" in str(result.message), result
    assert str(workspace) not in str(result.message)


def test_progress_is_streamed_as_events(reg: Callable[..., ToolRegistry]) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    result = call(reg(), "exec", {"command": "echo first; sleep 0.6; echo second"}, call_id="c9",
                  emit=lambda event, data: events.append((event, data)))
    assert result.ok
    lines = [line for event, data in events if event == "tool.progress" for line in data["lines"]]
    assert lines == ["first", "second"] and all(data["call_id"] == "c9" for _, data in events)


def test_denied_command_runs_nothing_at_all(reg: Callable[..., ToolRegistry], workspace: Path) -> None:
    result = call(reg(), "exec", {"command": "touch before; rm -rf / --no-preserve-root; touch after"})
    assert result.status == "REJECTED" and "refused" in result.message
    assert not (workspace / "before").exists() and not (workspace / "after").exists()


FORK_BOMBS = [":(){ :|:& };:", ":(){ :&:; };:", "f(){ f & f; }; f", "f(){ f | f & }; f", "bomb() { bomb|bomb& }; bomb",
              "function f { f & f; }; f", "f(){ for i in 1 2; do f & done; }; f"]
DANGEROUS = ["rm -rf /", "rm -fr ~", "rm -r -f /*", "sudo rm -rf /etc", "/bin/rm -Rf $HOME", "mkfs.ext4 /dev/sda1",
             "dd if=/dev/zero of=/dev/sda bs=1M", "shutdown -h now", "reboot", "systemctl poweroff", *FORK_BOMBS,
             "chmod -R 777 /", "find / -delete", "echo x > /dev/nvme0n1", "timeout 5 halt", "wipefs --version"]
BENIGN = ["echo hi", "ls -la", "cat notes.md", "true", "grep -r reboot .", "rm -rf build", "python3 -c 'print(1)'",
          "git log --oneline | head", "dd if=a.img of=b.img", "bash -lc 'echo hi'", "sh -ec ls",
          "greet(){ echo hi; }; greet &"]
SEPARATORS = ["; ", " && ", " || ", " | ", "\n", " & "]
WRAPS = ["{}", "$({})", "`{}`", "sh -c '{}'", 'bash -c "{}"', "( {} )", "eval '{}'", "{{ {}; }}", "env FOO=1 {}",
         "sh -ec '{}'", 'bash -lc "{}"', "bash -c -- '{}'", "bash -o pipefail -c '{}'", "busybox sh -xec '{}'"]


@given(before=st.lists(st.sampled_from(BENIGN), max_size=3), after=st.lists(st.sampled_from(BENIGN), max_size=3),
       bad=st.sampled_from(DANGEROUS), wrap=st.sampled_from(WRAPS), seps=st.lists(st.sampled_from(SEPARATORS),
                                                                                min_size=7, max_size=7))
def test_deny_list_checks_every_segment(before: list[str], after: list[str], bad: str, wrap: str,
                                        seps: list[str]) -> None:
    parts = [*before, wrap.format(bad), *after]
    command = parts[0] + "".join(sep + part for sep, part in zip(seps, parts[1:], strict=False))
    with pytest.raises(Denied):
        check_command(command)


@given(parts=st.lists(st.sampled_from(BENIGN), min_size=1, max_size=4),
       seps=st.lists(st.sampled_from(SEPARATORS), min_size=3, max_size=3))
def test_ordinary_commands_pass(parts: list[str], seps: list[str]) -> None:
    check_command(parts[0] + "".join(sep + part for sep, part in zip(seps, parts[1:], strict=False)))


@pytest.mark.parametrize("command", [
    'sh -ec "wipefs --version"', 'bash -lc "wipefs --version"', 'bash -c -- "wipefs --version"', 'sh -xec "reboot"',
    'bash -o pipefail -c "reboot"', 'bash -c -o pipefail "reboot"', 'bash -eo pipefail -c "reboot"',
    'bash --login -c "reboot"', 'bash --rcfile ~/.rc -c "reboot"', 'zsh -c - "reboot"', 'busybox sh -ec "halt"',
    "fish --command 'reboot'", "fish --command='rm -rf /'", "fish --init-command reboot",
])
def test_the_string_of_any_shell_option_with_c_is_checked(command: str) -> None:
    """`-ec`, `-lc` and `-c --` run a command string as `-c` does: the deny list looked only behind `-c`."""
    with pytest.raises(Denied, match="refused"):
        check_command(command)


@pytest.mark.parametrize("command", FORK_BOMBS)
def test_a_function_that_starts_itself_in_the_background_is_a_fork_bomb(command: str) -> None:
    with pytest.raises(Denied, match="fork bomb"):
        check_command(command)


@pytest.mark.parametrize("command", [
    'bash -lc "echo hi"', 'sh -ec "ls"', 'bash -c -- "echo hi"', 'bash -o pipefail -c "ls | head"',
    'bash --norc script.sh', "greet(){ echo hi; }; greet &", 'log(){ logger "$@" & }; log started',
    'walk(){ for d in "$1"/*; do walk "$d" & done; }; walk .', 'down(){ [ "$1" -gt 0 ] && down $(($1 - 1)); }; down 3',
    "say(){ echo say & }; say", "f(){ f_helper & }; f",
])
def test_ordinary_shell_strings_and_functions_pass(command: str) -> None:
    check_command(command)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs a root worker")


@needs_root
def test_root_worker_runs_commands_as_the_unprivileged_user(open_workspace: Path) -> None:
    from shared.tools import build_registry
    from tests.shared.tools.conftest import tool_settings

    reg = build_registry(tool_settings(open_workspace, allowed=["exec"], granted=["SHELL"]))
    out = call(reg, "exec", {"command": "id -u; touch mine; echo ok"}).output
    assert out.splitlines()[:2] == [str(pwd.getpwnam("nobody").pw_uid), "ok"]
    assert (open_workspace / "mine").stat().st_uid == pwd.getpwnam("nobody").pw_uid


@needs_root
def test_commands_can_change_what_write_file_made(open_workspace: Path) -> None:
    """Under a root worker the file tools made root's files and folders (644, 755): a command, run as
    nobody, could not add to the script the agent had just written, nor put a file beside it. What
    write_file makes is the exec user's now; a file that was there keeps its owner."""
    from shared.tools import build_registry
    from tests.shared.tools.conftest import tool_settings

    (open_workspace / "MEMORY.md").write_text("the operator's\n")
    reg = build_registry(tool_settings(open_workspace, allowed=["exec", "write_file"], granted=["SHELL", "FS_WRITE"]))
    assert call(reg, "write_file", {"path": "proj/deep/notes.md", "content": "one\n"}).ok
    assert call(reg, "write_file", {"path": "MEMORY.md", "content": "the agent's\n"}).ok
    result = call(reg, "exec", {"command": "echo two >> proj/deep/notes.md && touch proj/new.txt proj/deep/x"})
    assert result.ok and result.output.endswith("[exit code: 0]"), result
    assert (open_workspace / "proj/deep/notes.md").read_text() == "one\ntwo\n"
    nobody = pwd.getpwnam("nobody").pw_uid
    assert [(open_workspace / p).stat().st_uid for p in ("proj", "proj/deep", "proj/deep/notes.md")] == [nobody] * 3
    assert (open_workspace / "MEMORY.md").stat().st_uid == 0
    without_exec = build_registry(tool_settings(open_workspace, allowed=["write_file"], granted=["FS_WRITE"]))
    assert call(without_exec, "write_file", {"path": "solo.md", "content": "x"}).ok
    assert (open_workspace / "solo.md").stat().st_uid == 0  # no commands here: nothing to give it to


@needs_root
def test_root_worker_kills_what_cleared_its_environment_and_left_the_session(open_workspace: Path) -> None:
    from shared.tools import build_registry
    from tests.shared.tools.conftest import tool_settings

    reg = build_registry(tool_settings(open_workspace, allowed=["exec"], granted=["SHELL"]))
    result = call(reg, "exec", {"command": "setsid env -i sleep 300 >/dev/null 2>&1 & echo $! > e.pid; echo ok"})
    assert result.ok
    pid = int((open_workspace / "e.pid").read_text())
    try:
        wait_until(lambda: vanished(pid), timeout=10, message=f"process {pid} to be reaped")
    finally:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


@needs_root
def test_root_worker_reports_a_workspace_the_user_cannot_use(registry: Callable[..., ToolRegistry]) -> None:
    result = call(registry(allowed=["exec"], granted=["SHELL"]), "exec", {"command": "touch x"})
    assert result.error == ErrorCode.FAILED
    assert "'nobody'" in result.message and "NANOFLEET_TOOLS__EXEC__RUN_AS_USER" in result.message


_READ_OWN_ENVIRON = """
import ctypes, os, pwd, subprocess, sys
from shared.process_guard import guard_process_secrets
nobody = pwd.getpwnam("nobody")
os.setgroups([]); os.setgid(nobody.pw_gid); os.setuid(nobody.pw_uid)
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable, as any process its user starts (setuid cleared it)
if sys.argv[1] == "guarded":
    assert guard_process_secrets()
done = subprocess.run(["cat", f"/proc/{os.getpid()}/environ"], capture_output=True)
print("SECRET" in done.stdout.decode(errors="replace"), done.returncode)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become nobody")
@pytest.mark.parametrize(("mode", "readable"), [("guarded", False), ("open", True)])
def test_a_guarded_worker_hides_its_environment_from_its_own_user(mode: str, readable: bool) -> None:
    """As in the Docker image: the worker is not root, so exec's commands run as the worker's user."""
    env = {**os.environ, "X": "SECRET"}
    done = subprocess.run([sys.executable, "-c", _READ_OWN_ENVIRON, mode], env=env, capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr
    seen, code = done.stdout.split()
    assert (seen == "True") is readable and (code == "0") is readable
