"""`nanofleet cron list|add|remove|enable|disable` against the test database and Redis."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from datetime import datetime

import pytest
from typer.testing import CliRunner, Result

from gateway.cli import app
from gateway.status import masked
from shared.agent import conversations
from shared.scheduling.beat import BeatMirror, beat_app
from shared.settings import get_settings
from tests.support import databases
from tests.support.scheduling import TELEGRAM, db
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
        (["--every", "60", "--tz", "Europe/Paris"], "--tz applies only to cron expressions"),
    ]
    for args, reason in cases:
        out = cli.invoke(app, ["cron", "add", "-m", "x", *args])
        assert out.exit_code == 2 and reason in out.output, (args, out.output)
        assert isinstance(out.exception, SystemExit)  # a message, not a traceback
    assert "no cron jobs" in cli.invoke(app, ["cron", "list"]).output


def added_id(out: Result) -> str:
    assert out.exit_code == 0, out.output
    return out.output.split()[1].rstrip(":")


def refused(out: Result, code: int = 2) -> str:
    """The one line a refused command prints (no traceback)."""
    assert out.exit_code == code and isinstance(out.exception, SystemExit), out.output
    assert len(out.output.strip().splitlines()) == 1, out.output
    return out.output.strip()


@pytest.mark.parametrize("args", [["list"], ["add", "-m", "x", "--every", "60"]], ids=["list", "add"])
def test_a_database_never_migrated_is_named_in_a_line(args: list[str], cli: CliRunner) -> None:
    with databases.database_in("empty") as url:
        os.environ["NANOFLEET_DATABASE_URL"] = url
        get_settings.cache_clear()
        out = cli.invoke(app, ["cron", *args])
    assert refused(out, code=1) == f"nanofleet: the database at {masked(url)} {databases.reason('empty')}"


def test_cron_add_says_which_field_of_a_cron_line_is_wrong(cli: CliRunner) -> None:
    out = cli.invoke(app, ["cron", "add", "-m", "x", "--cron", "61 * * * *"])
    assert refused(out) == "nanofleet: '61 * * * *': minute '61' is out of range (0-59)"
    out = cli.invoke(app, ["cron", "add", "-m", "x", "--cron", "0 9 * *"])
    assert "has 4 fields; a cron expression has 5" in refused(out)


def test_cron_add_names_the_flag_of_each_invalid_value(cli: CliRunner) -> None:
    out = cli.invoke(app, ["cron", "add", "-m", "x", "--every", "0"])
    assert refused(out) == "nanofleet: --every: must be at least 1"
    out = cli.invoke(app, ["cron", "add", "-m", "x", "--every", "60", "--missed-policy", "never"])
    assert refused(out) == "nanofleet: --missed-policy: must be 'skip', 'run_once' or 'catch_up'"
    both = cli.invoke(app, ["cron", "add", "-m", "", "--every", "0"])
    assert both.exit_code == 2 and both.output.splitlines() == [
        "nanofleet: --message: must not be empty", "nanofleet: --every: must be at least 1"]
    assert "no cron jobs" in cli.invoke(app, ["cron", "list"]).output


def test_cron_add_names_the_settings_a_channel_needs(cli: CliRunner) -> None:
    out = cli.invoke(app, ["cron", "add", "-m", "x", "--every", "60", "--channel", "slack", "--chat-id", "C1"])
    assert refused(out) == ("nanofleet: channel 'slack' is not configured here: set "
                            "NANOFLEET_CHANNELS__SLACK__BOT_TOKEN, NANOFLEET_CHANNELS__SLACK__SIGNING_SECRET")


def test_cron_add_refuses_an_api_chat_id_that_names_no_conversation(stack: Stack, cli: CliRunner) -> None:
    out = cli.invoke(app, ["cron", "add", "-m", "x", "--every", "30", "--chat-id", "doesnotexist"])
    line = refused(out)
    assert "no conversation 'doesnotexist'" in line and "POST /api/v1/conversations" in line
    assert "leave --chat-id out" in line
    assert "no cron jobs" in cli.invoke(app, ["cron", "list"]).output
    with db(stack) as s:  # what `nanofleet agent` makes: its session key is the chat id its cron tool sets
        conv_id = conversations.get_or_create(s, session_key="cli:default", channel="cli", chat_id="cli:default").id
    for chat in ([], ["--chat-id", conv_id], ["--chat-id", "cli:default"]):
        added_id(cli.invoke(app, ["cron", "add", "-m", "x", "--every", "30", *chat]))


def test_cron_disable_and_enable_follow_in_beat(stack: Stack, cli: CliRunner) -> None:
    beat = BeatMirror(beat_app(stack.settings))
    job_id = added_id(cli.invoke(app, ["cron", "add", "-m", "x", "--every", "3600"]))
    assert beat.armed(job_id) is not None

    off = cli.invoke(app, ["cron", "disable", job_id])
    assert off.exit_code == 0 and off.output.strip() == f"disabled {job_id}", off.output
    assert beat.armed(job_id) is None
    [shown] = json.loads(cli.invoke(app, ["cron", "list", "--json"]).output)
    assert (shown["enabled"], shown["nextRunAt"]) == (False, None)

    on = cli.invoke(app, ["cron", "enable", job_id])
    [shown] = json.loads(cli.invoke(app, ["cron", "list", "--json"]).output)
    assert on.exit_code == 0 and on.output.strip() == f"enabled {job_id}: next run {shown['nextRunAt']}", on.output
    assert shown["enabled"] is True and beat.is_armed_for(job_id, datetime.fromisoformat(shown["nextRunAt"]))

    for command in ("enable", "disable"):
        assert refused(cli.invoke(app, ["cron", command, "nosuchjob"]), code=1) == "nanofleet: no cron job nosuchjob"


def test_agent_model_option_says_what_it_takes() -> None:
    out = CliRunner().invoke(app, ["agent", "--help"])
    assert "--model <str> the model for this turn: a profile name or a litellm model string" in " ".join(
        out.output.split())


@pytest.mark.parametrize(("at", "tz", "instant"), [
    ("2027-01-01T10:00:00.5+02:00", [], "2027-01-01T08:00:00+00:00"),  # kept to the whole second
    ("2027-01-01 10:00", [], "2027-01-01T10:00:00+00:00"),  # no offset: NANOFLEET_SCHEDULER__TIMEZONE (UTC)
    ("2027-01-01 10:00", ["--tz", "Asia/Tokyo"], "2027-01-01T01:00:00+00:00"),
    ("2027-01-01T10:00Z", [], "2027-01-01T10:00:00+00:00"),
    ("2027-01-01", ["--tz", "Europe/Paris"], "2026-12-31T23:00:00+00:00"),
    # a time the clocks skip is the end of the gap (03:00), as '30 2 * * *' runs that day (it was 03:30)
    ("2027-03-28T02:30", ["--tz", "Europe/Berlin"], "2027-03-28T01:00:00+00:00"),
], ids=["fraction-offset", "space-naive", "naive-in-tz", "zulu", "date", "in-the-spring-gap"])
def test_cron_add_at_takes_what_the_rest_api_takes(at: str, tz: list[str], instant: str, cli: CliRunner) -> None:
    """`at` is read as the REST API reads it (pydantic's ISO-8601), a time without offset in `--tz`
    (these were refused with a usage error listing strptime formats)."""
    job_id = added_id(cli.invoke(app, ["cron", "add", "-m", "x", "--at", at, *tz]))
    [shown] = json.loads(cli.invoke(app, ["cron", "list", "--json"]).output)
    assert shown["id"] == job_id and datetime.fromisoformat(shown["at"]) == datetime.fromisoformat(instant), shown


@pytest.mark.parametrize("at", ["tomorrow", "2027-13-01T10:00", "2027-01-01T25:00", ""])
def test_cron_add_at_names_the_forms_it_takes_in_a_line(at: str, cli: CliRunner) -> None:
    line = refused(cli.invoke(app, ["cron", "add", "-m", "x", "--at", at]))
    assert line.startswith("nanofleet: --at: must be an ISO-8601 time") and "2027-01-01T10:00" in line, line
    assert "no cron jobs" in cli.invoke(app, ["cron", "list"]).output


@pytest.mark.parametrize("message", ["", "   ", "\n\t"], ids=["empty", "spaces", "whitespace"])
def test_cron_add_refuses_a_blank_message(message: str, cli: CliRunner) -> None:
    assert refused(cli.invoke(app, ["cron", "add", "-m", message, "--every", "60"])) == (
        "nanofleet: --message: must not be empty")
    assert "no cron jobs" in cli.invoke(app, ["cron", "list"]).output
