"""Item 7: each process of the compose deployment (docker/compose.yml's roles, pools and
concurrency): seconds from start until it answers, and its memory once turns with a tool call have
gone through all of them. Memory is the proportional set size (PSS) of the process tree, so a
prefork pool's pages shared with its parent count once."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import httpx

from bench.context import Ctx
from bench.report import Figure
from bench.services import free_port
from bench.stack import AUTH, BenchStack, tree_memory
from tests.support.processes import Proc, wait_until

TURNS = 20
# (role, queues, pool, concurrency), as docker/compose.yml runs them
WORKERS = (("worker-agent", "agent", "threads", 200), ("worker-tools", "tools", "prefork", 4),
           ("worker-subagents", "subagents", "threads", 50), ("worker-outbound", "outbound,scheduler", "threads", 20))


def _timed(start: Callable[[], Proc]) -> tuple[Proc, float]:
    began = time.monotonic()
    proc = start()
    return proc, time.monotonic() - began


def _beat(stack: BenchStack) -> Proc:
    beat = stack.beat()  # (the stack's teardown stops it, should it not start)
    wait_until(lambda: "static schedule written" in beat.log(), timeout=60, interval=0.05, message="beat to start")
    return beat


def run(ctx: Ctx) -> None:
    stack = ctx.stack
    stack.reset_data()
    port = free_port()
    started: dict[str, tuple[Proc, float]] = {}
    try:
        started["gateway"] = _timed(lambda: stack.gateway(port))
        for role, queues, pool, concurrency in WORKERS:
            started[role] = _timed(functools.partial(stack.worker, queues=queues, pool=pool, concurrency=concurrency))
        started["beat"] = _timed(lambda: _beat(stack))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=60) as http:
            for _ in range(TURNS):
                cid = http.post("/api/v1/conversations").json()["conversationId"]
                answer = http.post(f"/api/v1/conversations/{cid}/chat", json={"message": "call:time"}).json()
                assert [c["status"] for c in answer["toolCalls"]] == ["SUCCESS"], answer
        pss = {role: tree_memory(proc.pid, pss=True) / 2**20 for role, (proc, _) in started.items()}
    finally:
        stack.stop_procs([proc for proc, _ in started.values()])
    _report(ctx, started, pss)
    stack.reset_data()


def _report(ctx: Ctx, started: dict[str, tuple[Proc, float]], pss: dict[str, float]) -> None:
    cmd = ctx.cfg.command("memory")
    for role, (_, seconds) in started.items():
        ctx.report.add(Figure("7", f"{role}: memory after {TURNS} one-tool turns (PSS, process tree)", pss[role],
                              "MiB", command=cmd, note=f"ready {seconds:.1f} s after start"))
    ctx.report.add(Figure("7", "the whole deployment (one of each)", sum(pss.values()), "MiB", command=cmd))
    rows = "\n".join(f"| {role} | {seconds:.1f} | {pss[role]:.0f} |" for role, (_, seconds) in started.items())
    ctx.report.sections.append((
        "Item 7: memory of each process",
        "One process of each compose role with compose's pool and concurrency; the gateway is a fresh "
        "one. Ready: a worker answers a ping, the gateway /healthz, beat has written its schedule. Only "
        "the agent and subagents workers load litellm.\n\n"
        "| process | ready s | PSS MiB |\n|---|---|---|\n" + rows))
