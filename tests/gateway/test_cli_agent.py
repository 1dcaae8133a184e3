"""`nanofleet agent`'s arguments: what the REST API refuses for a chat is refused up front, in a line,
before any conversation is made or the model is called."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator

import pytest
from sqlmodel import select
from typer.testing import CliRunner, Result

from gateway.cli import app
from shared.models import Conversation
from shared.settings import get_settings
from tests.fakes.llm import FakeLLM
from tests.support.scheduling import db
from tests.support.stack import Stack

PROFILES = json.dumps({"fast": {"model": "openai/fake-model"}})


@pytest.fixture
def stack(make_stack: Callable[..., Stack], fake_llm: FakeLLM) -> Stack:
    """A private stack with a profile `fast` on the fake model (no process started)."""
    return make_stack(LLM__PROFILES=PROFILES)


@pytest.fixture
def cli(stack: Stack) -> Iterator[Callable[..., Result]]:
    """Invoke `nanofleet` in-process with the stack's environment (and `env` on top). `agent` sets up
    logging as its process's: the test process's is put back after."""
    saved, root = dict(os.environ), logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
        os.environ.clear()
        os.environ.update({**stack.env, **(env or {})})
        get_settings.cache_clear()
        return CliRunner().invoke(app, list(args))

    try:
        yield invoke
    finally:
        os.environ.clear()
        os.environ.update(saved)
        get_settings.cache_clear()
        root.handlers[:] = handlers
        root.setLevel(level)


def refused(out: Result) -> str:
    """The one line a bad argument prints, exit 2 (no traceback, no usage text)."""
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.output
    assert len(out.output.strip().splitlines()) == 1, out.output
    return out.output.strip()


def no_conversation(stack: Stack, fake_llm: FakeLLM) -> bool:
    with db(stack) as s:
        return s.exec(select(Conversation.id)).first() is None and fake_llm.calls() == 0


@pytest.mark.parametrize(("model", "allowed", "why"), [
    ("http://x/y", [], "names a URL"),
    ("oobabooga/http://127.0.0.1:9/v1", [], "names a URL"),
    ("bogus-profile", ["openai/other"], "is not allowed here"),
    ("m" * 201, [], "--model: must be at most 200 characters"),
], ids=["url", "provider-url", "not-listed", "too-long"])
def test_a_model_the_api_refuses_is_refused_before_the_turn(
        model: str, allowed: list[str], why: str, stack: Stack, fake_llm: FakeLLM,
        cli: Callable[..., Result]) -> None:
    out = cli("agent", "-m", "hi", "--model", model, env={"NANOFLEET_LLM__ALLOWED_MODELS": json.dumps(allowed)})
    line = refused(out)
    assert line.startswith("nanofleet: ") and why in line, line
    if "characters" not in why:  # the API's own words, and the choices it offers
        assert "ask for one of: fast, openai/fake-model" in line, line
    assert no_conversation(stack, fake_llm)


def test_the_models_the_api_takes_are_taken(fake_llm: FakeLLM, cli: Callable[..., Result]) -> None:
    for model in ("fast", "openai/fake-model"):
        out = cli("agent", "-m", "hi", "--model", model, "--session", f"cli:{model}")
        assert out.exit_code == 0 and out.output.strip() == "echo: hi", out.output


@pytest.mark.parametrize("session", ["", "   "], ids=["empty", "blank"])
def test_a_blank_session_is_refused(session: str, stack: Stack, fake_llm: FakeLLM,
                                    cli: Callable[..., Result]) -> None:
    assert refused(cli("agent", "-m", "hi", "--session", session)) == "nanofleet: --session: must not be empty"
    assert no_conversation(stack, fake_llm)


@pytest.mark.parametrize("message", ["", "   "], ids=["empty", "blank"])
def test_a_blank_message_is_refused_in_a_line(message: str, cli: Callable[..., Result]) -> None:
    assert refused(cli("agent", "-m", message)) == "nanofleet: --message: must not be empty"
