"""The secrets in a nanofleet process's environment stay out of reach of a command exec runs as the
same user: `nanofleet agent` (which runs exec in-process), `up`, and the gateway, worker and beat
it starts, and a gateway's spawned workers, are non-dumpable; what they start that cannot be
(multiprocessing's resource tracker) is started without the secrets. Probed as the security
review did, from processes with no more rights than an ordinary user's over their own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.fakes.server import free_port
from tests.support import unprivileged
from tests.support.processes import ROOT, wait_until
from tests.support.stack import Stack

_UNAVAILABLE = unprivileged.available()
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE))
CANARY = "CANARY_TOKEN=c4nary-0f-the-operator"
LLM_KEY = "sk-fake-key-for-tests"  # make_env's NANOFLEET_LLM__API_KEY


def _env(s: Stack) -> dict[str, str]:
    name, value = CANARY.split("=")
    return {**s.env, name: value}


def _shows_secrets(pid: int) -> bool:
    env = unprivileged.read_environ(pid)
    return env is not None and (CANARY in env or LLM_KEY in env)


def _hide_secrets(processes: dict[str, int]) -> None:
    """Wait until none of `processes` (name -> pid) shows its secrets; fail naming those that do."""
    def showing() -> list[str]:
        return [f"{name} (pid {pid})" for name, pid in processes.items() if _shows_secrets(pid)]

    try:
        wait_until(lambda: not showing(), timeout=30, message="the processes to hide their environment")
    except AssertionError:
        raise AssertionError(f"a process of their user reads the secrets of: {', '.join(showing())}") from None


@pytest.fixture
def control() -> Iterator[Callable[[dict[str, str]], None]]:
    """Check that the probe works here: a plain process started the same way shows its secrets."""
    started: list[subprocess.Popen[bytes]] = []

    def check(env: dict[str, str]) -> None:
        started.append(plain := unprivileged.popen(["sleep", "300"], env=env))
        assert _shows_secrets(plain.pid), "the probe cannot read even an unguarded process's environment"

    yield check
    for proc in started:
        proc.kill()
        proc.wait()


def test_agent_command_hides_its_environment_from_the_commands_it_runs(
        make_stack: Callable[..., Stack], control: Callable[[dict[str, str]], None]) -> None:
    """The reviewer's probe: an exec call that reads its parent's (the agent's) environment."""
    s = make_stack(TOOLS__ALLOWED=json.dumps(["exec"]), PERMISSIONS__GRANTED=json.dumps(["SHELL"]),
                   TOOLS__EXEC__RUN_AS_USER="")
    env = {**_env(s), "NANOFLEET_REDIS_URL": "redis://127.0.0.1:1/0"}  # no broker needed
    control(env)
    probe = "call:exec " + json.dumps({"command": "tr '\\0' '\\n' < /proc/$PPID/environ"})
    done = unprivileged.run([sys.executable, "-m", "gateway.cli", "agent", "-m", probe], cwd=ROOT, env=env,
                            timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("done: "), done.stdout  # the command ran, and was refused
    assert "Permission denied" in done.stdout, done.stdout
    assert CANARY not in done.stdout and LLM_KEY not in done.stdout, done.stdout


def _role(proc: psutil.Process) -> str | None:
    with contextlib.suppress(psutil.Error):
        line = " ".join(proc.cmdline())
        for marker, role in (("workers.beat:app", "beat"), ("workers.app:app", "worker"),
                             ("gateway.cli gateway", "gateway")):
            if marker in line:
                return role
    return None


def _roles(up: psutil.Process) -> dict[str, int]:
    found = {"up": up.pid}
    for child in up.children():
        if (role := _role(child)) is not None:
            found[role] = child.pid
    return found


def test_up_and_the_gateway_worker_and_beat_it_starts_hide_their_environment(
        make_stack: Callable[..., Stack], control: Callable[[dict[str, str]], None], tmp_path: Path) -> None:
    env, port, log = _env(make_stack()), free_port(), tmp_path / "up.log"
    control(env)
    with log.open("wb") as out:
        proc = unprivileged.popen([sys.executable, "-m", "gateway.cli", "up", "--port", str(port), "--concurrency",
                                   "2"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: proc.poll() is not None or "nanofleet: up at" in log.read_text(), timeout=120,
                   message="`up` to say it is up")
        assert proc.poll() is None, log.read_text()
        up = psutil.Process(proc.pid)
        roles = wait_until(lambda: len(found := _roles(up)) == 4 and found, timeout=60,
                           message="gateway, worker and beat")
        assert isinstance(roles, dict)
        _hide_secrets(roles)
    finally:
        family = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        finally:
            for p in family:
                with contextlib.suppress(psutil.Error):
                    p.kill()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_gateway_with_several_workers_hides_its_environment(
        make_stack: Callable[..., Stack], control: Callable[[dict[str, str]], None], tmp_path: Path) -> None:
    """uvicorn starts each worker as a new program, and multiprocessing's resource tracker with them."""
    env, port = _env(make_stack()), free_port()
    control(env)
    with (tmp_path / "gateway.log").open("wb") as out:
        proc = unprivileged.popen([sys.executable, "-m", "gateway.cli", "gateway", "--port", str(port),
                                   "--workers", "2"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        wait_until(lambda: proc.poll() is not None or _answers(f"http://127.0.0.1:{port}/healthz"), timeout=120,
                   message="the gateway to answer")
        assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
        gateway = psutil.Process(proc.pid)
        children = wait_until(lambda: len(found := gateway.children()) >= 3 and found, timeout=60,
                              message="two workers and the resource tracker")
        assert isinstance(children, list)
        _hide_secrets({" ".join(p.cmdline()[1:]): p.pid for p in [gateway, *children]})
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
