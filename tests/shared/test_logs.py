"""Logging: JSON lines without junk fields, and an idle system quiet at INFO while a turn's task
lines and every warning still show."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery.app import trace

from shared.constants import REDBEAT_PREFIX, T_AGENT_STEP, T_SWEEP
from shared.logs import configure_logging
from tests.support.processes import wait_until
from tests.support.stack import Stack, api_client

Lines = Callable[[], list[dict[str, Any]]]


@pytest.fixture
def json_lines() -> Iterator[Lines]:
    """Logging as the processes configure it (INFO, JSON lines); the lines written so far."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level, {n: logging.getLogger(n).level for n in ("httpx", "httpcore", "litellm")}
    configure_logging(level="INFO", json=True)
    out = io.StringIO()
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(out)
    yield lambda: [json.loads(x) for x in out.getvalue().splitlines()]
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def test_uvicorn_lines_carry_no_junk_fields(json_lines: Lines, monkeypatch: pytest.MonkeyPatch) -> None:
    """litellm stamps records of loggers it filters (uvicorn.error among them) with a bare object,
    and uvicorn adds a copy of the message with terminal colours."""
    import litellm._logging  # noqa: F401  (what a process that calls the model imports)

    for name in ("uvicorn", "uvicorn.error"):  # as `nanofleet gateway` runs uvicorn (log_config=None), even
        logger = logging.getLogger(name)       # after another test ran a server with uvicorn's own config
        for attr, value in (("handlers", []), ("propagate", True), ("disabled", False), ("level", logging.NOTSET)):
            monkeypatch.setattr(logger, attr, value)
        logger.setLevel(logging.NOTSET)  # and forget what the loggers had cached for the old level
    logging.getLogger("uvicorn.error").info("Started server process [%d]", 4242,
                                            extra={"color_message": "Started server process [\x1b[36m%d\x1b[0m]"})
    logging.getLogger("TOOL_AUDIT").info("tool=time", extra={"tool": "time", "duration_ms": 1.5, "opaque": object()})
    started, audit = json_lines()
    assert started["message"] == "Started server process [4242]" and started["level"] == "INFO"
    assert set(started) == {"time", "level", "name", "message", "request_id"}
    assert audit["tool"] == "time" and audit["duration_ms"] == 1.5 and "opaque" not in audit


def test_only_the_sweeps_task_lines_are_demoted(json_lines: Lines) -> None:
    """Celery's own calls, as the worker and beat make them."""
    for name in (T_SWEEP, T_AGENT_STEP):
        context = {"id": "c0ffee", "name": name, "return_value": "None", "runtime": 0.01, "args": "()", "kwargs": "{}"}
        trace.info(trace.LOG_SUCCESS, context)
        logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", "entry", name)
        trace.logger.warning(trace.LOG_FAILURE, {**context, "description": "raised unexpected", "exc": "boom"})
    shown = [(r["level"], r["message"]) for r in json_lines()]
    assert shown == [
        ("WARNING", f"Task {T_SWEEP}[c0ffee] raised unexpected: boom"),
        ("INFO", f"Task {T_AGENT_STEP}[c0ffee] succeeded in 0.01s: None"),
        ("INFO", f"Scheduler: Sending due task entry ({T_AGENT_STEP})"),
        ("WARNING", f"Task {T_AGENT_STEP}[c0ffee] raised unexpected: boom"),
    ]


def test_the_sweeps_lines_show_at_debug(json_lines: Lines) -> None:
    logging.getLogger().setLevel(logging.DEBUG)
    logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", "nanofleet-sweep", T_SWEEP)
    assert [(r["level"], r["name"]) for r in json_lines()] == [("DEBUG", "celery.beat")]


def test_an_idle_system_is_quiet_at_info_and_a_turn_is_not(make_stack: Callable[..., Stack]) -> None:
    s = make_stack()  # the default log level, INFO; a sweep every 0.5 s
    worker, beat = s.worker(), s.beat()
    client = redis.Redis.from_url(s.settings.redis_url)

    def swept() -> bool:
        meta = json.loads(client.hget(f"{REDBEAT_PREFIX}nanofleet-sweep", "meta") or "{}")  # type: ignore[arg-type]
        return meta.get("total_run_count", 0) >= 4 and client.llen("scheduler") == 0  # sent, and taken

    wait_until(swept, timeout=60, message="beat to send sweeps and the worker to take them")
    for api in api_client(s.settings):
        cid = api.post("/api/v1/conversations").json()["conversationId"]
        answer = api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "hello"})
        assert answer.json()["assistantMessage"] == "echo: hello", answer.text
    client.close()

    def records() -> list[dict[str, str]]:
        return [json.loads(x) for p in (worker, beat) for x in p.log().splitlines() if x.startswith("{")]

    def step() -> list[str]:
        return [r["message"] for r in records() if r["level"] == "INFO" and f"Task {T_AGENT_STEP}[" in r["message"]]

    # Celery writes a task's "succeeded" line once it has returned: after the reply the chat waited for
    wait_until(lambda: any(" succeeded in " in m for m in step()), timeout=30, message="the step's succeeded line")
    assert any(m.endswith("received") for m in step())
    assert not [r for r in records() if T_SWEEP in r["message"] or "nanofleet-sweep" in r["message"]]


def test_a_secret_is_masked_however_a_json_line_escapes_it() -> None:
    """A JSON line writes a quote, a backslash or a letter outside ASCII escaped: the secret as
    configured did not match there, and went out whole (security review)."""
    out = io.StringIO()
    secrets = ['p@ss"w0rd-xyz', "tok\\en-12345", "pässwört-789"]
    root, saved = logging.getLogger(), logging.getLogger().handlers[:]
    try:
        configure_logging(level="INFO", json=True, secrets=secrets)
        handler = root.handlers[0]
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(out)
        for secret in secrets:
            logging.getLogger("probe").warning("connecting with %s", secret)
    finally:
        root.handlers[:] = saved
    lines = [json.loads(line)["message"] for line in out.getvalue().splitlines()]
    assert lines == ["connecting with ***"] * 3, out.getvalue()
