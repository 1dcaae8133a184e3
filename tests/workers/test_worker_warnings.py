"""A worker says which settings look like mistakes when it starts, as every process does, and not
again at its first task: they came only with the first task (an idle worker never said them)."""

from __future__ import annotations

import json
from collections.abc import Callable

from tests.support.processes import wait_until
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
