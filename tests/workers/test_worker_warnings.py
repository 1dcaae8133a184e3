"""A worker says which settings look like mistakes when it starts, as every process does, and not
again at its first task: they came only with the first task (an idle worker never said them)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from tests.support.processes import ROOT, wait_until
from tests.support.stack import Stack, api_client

MISSPELT = "NANOFLEET_API_KEY is not a nanofleet setting, so it is ignored: did you mean NANOFLEET_API_KEYS?"
UNKNOWN_TOOL = "NANOFLEET_TOOLS__ALLOWED: 'tmie' match no known tool"


def test_a_worker_warns_at_start_and_once(make_stack: Callable[..., Stack]) -> None:
    s = make_stack(API_KEY="x", TOOLS__ALLOWED=json.dumps(["time", "tmie"]))
    worker = s.worker(concurrency=2)
    wait_until(lambda: "ready." in worker.log(), timeout=60, message="the worker to be ready")
    log = worker.log()
    assert MISSPELT in log and UNKNOWN_TOOL in log and log.index(MISSPELT) < log.index("ready.")
    for api in api_client(s.settings):  # the first task builds the tool registry: nothing said again
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "hi"}).json()[
            "assistantMessage"] == "echo: hi"
    assert worker.log().count(MISSPELT) == 1 and worker.log().count(UNKNOWN_TOOL) == 1


def test_a_misspelt_mcp_tool_is_warned_of_once_its_server_listed(make_stack: Callable[..., Stack]) -> None:
    """At start no MCP server has listed its tools, so an `mcp_` entry cannot be checked yet; the
    registry the first task builds can, and still says so (it said nothing after the start's warning)."""
    server = {"command": sys.executable, "args": ["-m", "tests.support.mcp_named_server"], "cwd": str(ROOT),
              "env": {"MCP_LABEL": "S", "MCP_TOOL_NAMES": "real"}}
    s = make_stack(TOOLS__ALLOWED=json.dumps(["time", "mcp_s_reel"]), TOOLS__MCP_SERVERS=json.dumps({"s": server}))
    worker = s.worker(concurrency=2)
    wait_until(lambda: "ready." in worker.log(), timeout=60, message="the worker to be ready")
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "hi"})
    wait_until(lambda: "'mcp_s_reel' match no known tool" in worker.log(), timeout=30,
               message="the warning about the misspelt MCP tool")
    assert worker.log().count("match no known tool") == 1
