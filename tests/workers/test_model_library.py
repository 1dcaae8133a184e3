"""Only the processes that call the model load litellm (about 2.5 s of CPU and 170 MiB each): after
a turn with a tool call has gone through them all, the agent worker has it loaded; the gateway, beat
and the tools and outbound workers do not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psutil

from tests.support.processes import Proc, wait_until
from tests.support.stack import Stack, gateway_process

# litellm imports tiktoken (a compiled extension, so it shows in the process's memory map) when it
# is imported itself; nothing else in nanofleet does.
MARKER = "/tiktoken/"


def _loaded(proc: Proc) -> bool:
    root = psutil.Process(proc.pid)
    return any(MARKER in Path(f"/proc/{p.pid}/maps").read_text() for p in [root, *root.children(recursive=True)])


def test_only_the_agent_worker_loads_litellm(make_stack: Callable[..., Stack]) -> None:
    s = make_stack()
    beat = s.beat()  # the processes start side by side; the turn waits for the ones it needs
    agent = s.worker(queues="agent", concurrency=2, wait=False)
    tools = s.worker(queues="tools", pool="prefork", concurrency=1, wait=False)
    outbound = s.worker(queues="outbound,scheduler", concurrency=2, wait=False)
    with gateway_process(s) as (gateway, client):
        cid = client.post("/api/v1/conversations").json()["conversationId"]
        r = client.post(f"/api/v1/conversations/{cid}/chat", json={"message": "call:time"})
        assert r.status_code == 200, r.text
        assert [c["status"] for c in r.json()["toolCalls"]] == ["SUCCESS"], r.json()
        wait_until(lambda: "static schedule written" in beat.log(), timeout=30, message="beat to write its schedule")
        assert _loaded(agent), f"the marker {MARKER!r} is no sign of litellm any more"
        assert {"gateway": _loaded(gateway), "tools worker": _loaded(tools), "outbound worker": _loaded(outbound),
                "beat": _loaded(beat)} == dict.fromkeys(("gateway", "tools worker", "outbound worker", "beat"), False)
