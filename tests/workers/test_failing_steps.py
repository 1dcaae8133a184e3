"""Through real workers and the sweeper: a turn whose step raises every time ends with a reply
after a bounded number of tries, instead of holding its conversation (and /chat) for ever."""

from __future__ import annotations

import json
from collections.abc import Callable

from shared.agent import steps
from tests.fakes.llm import FakeLLM
from tests.support.stack import Stack, api_client
from tests.support.tools import PLUGINS
from tests.workers.broken_prompt import FAULT, MARKER, PLUGIN


def test_a_turn_whose_step_always_raises_gets_a_failure_reply_and_the_chat_goes_on(
        make_stack: Callable[..., Stack], fake_llm: FakeLLM) -> None:
    s = make_stack(RUNTIME__MAX_RECOVERIES="2", TOOLS__PLUGINS=json.dumps([*PLUGINS, PLUGIN]))
    (s.workspace / MARKER).touch()
    worker = s.worker()
    s.beat()  # the sweeper: it takes a failed step back
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        answer = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "hello"})
        assert answer.status_code == 200, answer.text
        assert (answer.json()["status"], answer.json()["assistantMessage"]) == ("failed", steps.FAILED_STEP)
        run = api.get(f"/api/v1/runs/{answer.json()['runId']}").json()
        assert "failed 2 times" in run["error"] and FAULT in run["error"]
        (s.workspace / MARKER).unlink()
        assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "again"}).json()[
            "assistantMessage"] == "echo: again"
    assert fake_llm.calls() == 1  # the failed turn never reached the model
    log = worker.log()
    assert log.count("raised unexpected: RuntimeError") == 1  # the try that was taken back; the last one ends the run
    assert log.count("step 0 failed 2 times; failing the run") == 1
