"""`nanofleet cron list|add|remove` against the test database and Redis."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator

import pytest
from typer.testing import CliRunner

from gateway.cli import app
from shared.scheduling.beat import BeatMirror, beat_app
from shared.settings import get_settings
from tests.support.scheduling import TELEGRAM
from tests.support.stack import Stack


@pytest.fixture
def stack(make_stack: Callable[..., Stack]) -> Stack:
    """A private stack with Telegram configured, so jobs may send their results there."""
    return make_stack(**TELEGRAM)


@pytest.fixture
def cli(stack: Stack) -> Iterator[CliRunner]:
    saved = dict(os.environ)
    os.environ.update(stack.env)
    get_settings.cache_clear()
    try:
        yield CliRunner()
    finally:
        os.environ.clear()
        os.environ.update(saved)
        get_settings.cache_clear()


def test_cron_add_list_remove(stack: Stack, cli: CliRunner) -> None:
    added = cli.invoke(app, ["cron", "add", "-m", "weekly report", "--cron", "0 8 * * 1", "--tz", "Asia/Tokyo",
                             "--channel", "telegram", "--chat-id", "42", "--name", "report"])
    assert added.exit_code == 0, added.output
    job_id = added.output.split()[1].rstrip(":")
    assert BeatMirror(beat_app(stack.settings)).armed(job_id) is not None

    listed = cli.invoke(app, ["cron", "list"])
    assert job_id in listed.output and "0 8 * * 1 (Asia/Tokyo)" in listed.output and "telegram:42" in listed.output
    [shown] = json.loads(cli.invoke(app, ["cron", "list", "--json"]).output)
    assert (shown["id"], shown["name"], shown["enabled"]) == (job_id, "report", True)

    bad = cli.invoke(app, ["cron", "add", "-m", "x", "--every", "5", "--cron", "* * * * *"])
    assert bad.exit_code == 2 and "give exactly one of --every, --cron or --at" in bad.output

    assert cli.invoke(app, ["cron", "remove", job_id]).exit_code == 0
    assert BeatMirror(beat_app(stack.settings)).armed(job_id) is None
    assert cli.invoke(app, ["cron", "remove", job_id]).exit_code == 1
    assert "no cron jobs" in cli.invoke(app, ["cron", "list"]).output


def test_cron_add_refuses_what_cannot_run_or_reach_anyone(cli: CliRunner) -> None:
    cases = [
        (["--at", "9999-12-31T23:00:00-0500"], "out of range"),
        (["--every", "60", "--channel", "nosuch", "--chat-id", "1"], "unknown channel 'nosuch'"),
        (["--every", "60", "--channel", "slack", "--chat-id", "C1"], "'slack' is not configured"),
        (["--every", "60", "--channel", "telegram"], "needs a --chat-id"),
        (["--name", "no schedule"], "give exactly one of --every, --cron or --at"),
        (["--every", "60", "--tz", "Europe/Paris"], "tz applies only to cron expressions"),
    ]
    for args, reason in cases:
        out = cli.invoke(app, ["cron", "add", "-m", "x", *args])
        assert out.exit_code == 2 and reason in out.output, (args, out.output)
        assert isinstance(out.exception, SystemExit)  # a message, not a traceback
    assert "no cron jobs" in cli.invoke(app, ["cron", "list"]).output
