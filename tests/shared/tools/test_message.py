"""message: outbox rows with a unique key, delivery tasks handed back as follow-ups, and the turn's
final reply suppressed when the message went to the turn's own chat."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, select

from shared.constants import T_OUTBOUND_DELIVER
from shared.db import get_engine
from shared.models import Outbox, Run, RunKind, ToolCall
from shared.settings import Settings
from shared.tool_settings import MessageSettings
from shared.tools import build_registry
from shared.tools.base import ErrorCode, ToolContext
from shared.tools.registry import ToolRegistry
from tests.shared.tools.conftest import call, tool_settings
from tests.support.stack import clean_db

CHANNELS = {"telegram": {"token": "123:telegram-test-token", "webhook_secret": "telegram-test-secret"},
            "slack": {"bot_token": "xoxb-slack-test-token", "signing_secret": "slack-test-secret"}}


def configured(settings: Settings, database_url: str) -> Settings:
    """The test database, and Telegram and Slack switched on (their secrets set)."""
    channels = settings.channels.model_validate(CHANNELS)
    return settings.model_copy(update={"database_url": database_url, "channels": channels})


def allowing(database_url: str, workspace: Path, send_to: list[str]) -> ToolRegistry:
    """The message tool, allowed to send to the chats `send_to` lists too."""
    settings = configured(tool_settings(workspace, allowed=["message"], granted=[]), database_url)
    tools = settings.tools.model_copy(update={"message": MessageSettings(send_to=send_to)})
    return build_registry(settings.model_copy(update={"tools": tools}))


@pytest.fixture
def reg(database_url: str, workspace: Path) -> ToolRegistry:
    clean_db(database_url)
    return build_registry(configured(tool_settings(workspace, allowed=["message"], granted=[]), database_url))


def send(reg: ToolRegistry, run: Run, args: dict[str, Any], call_id: str = "call_1") -> tuple[Any, ToolContext]:
    origin = run.origin
    ctx = ToolContext(settings=reg.settings, run_id=run.id, conversation_id=run.conversation_id,
                      channel=origin["channel"], chat_id=origin["chat_id"], run_kind=run.kind.value, call_id=call_id,
                      extra={"origin": origin})
    from shared.aio import run_sync

    return run_sync(reg.execute("message", args, ctx)), ctx


def rows(database_url: str) -> list[Outbox]:
    with Session(get_engine(database_url)) as s:
        return list(s.exec(select(Outbox).order_by(Outbox.key)))


def suppressed(database_url: str, run_id: str) -> bool:
    with Session(get_engine(database_url)) as s:
        return s.get_one(Run, run_id).suppress_reply


def test_message_to_the_own_chat_replaces_the_final_reply(reg: ToolRegistry, make_run: Callable[..., Run],
                                                          database_url: str) -> None:
    run = make_run()
    result, ctx = send(reg, run, {"content": "Working on it, back in a minute."})
    assert result.ok
    [row] = rows(database_url)
    assert (row.channel, row.chat_id, row.content) == ("telegram", "42", "Working on it, back in a minute.")
    assert row.key == f"{run.id}:None:call_1:msg:0" and row.meta["reply_to_message_id"] == 7  # no journal row here
    assert [(n.task, n.args) for n in ctx.followups] == [(T_OUTBOUND_DELIVER, (row.id,))]
    assert suppressed(database_url, run.id)


def test_message_to_another_chat_keeps_the_reply(database_url: str, workspace: Path,
                                                 make_run: Callable[..., Run]) -> None:
    clean_db(database_url)
    reg = allowing(database_url, workspace, ["slack:C123"])
    run = make_run()
    result, _ = send(reg, run, {"content": "ping", "channel": "slack", "chat_id": "C123"})
    assert result.ok
    assert [(r.channel, r.chat_id, r.meta.get("reply_to_message_id")) for r in rows(database_url)] == [
        ("slack", "C123", None)]
    assert not suppressed(database_url, run.id)


def test_other_chats_only_when_the_operator_lists_them(reg: ToolRegistry, database_url: str, workspace: Path,
                                                       make_run: Callable[..., Run]) -> None:
    """Text the model read (a fetched page, a file) must not have it write to other people."""
    run = make_run()
    for target in ({"channel": "slack", "chat_id": "C123"}, {"chat_id": "43"}):
        refused = send(reg, run, {"content": "the secrets", **target})[0]
        assert refused.error == ErrorCode.NOT_ALLOWED and "NANOFLEET_TOOLS__MESSAGE__SEND_TO" in refused.message
    assert rows(database_url) == []
    anywhere_on_slack = allowing(database_url, workspace, ["slack:*"])
    assert send(anywhere_on_slack, run, {"content": "hi", "channel": "slack", "chat_id": "C9"})[0].ok
    assert send(anywhere_on_slack, run, {"content": "hi", "chat_id": "43"}, call_id="call_2")[0].error \
        == ErrorCode.NOT_ALLOWED
    assert [(r.channel, r.chat_id) for r in rows(database_url)] == [("slack", "C9")]


def test_cron_runs_never_suppress(reg: ToolRegistry, make_run: Callable[..., Run], database_url: str) -> None:
    run = make_run(kind=RunKind.CRON)
    assert send(reg, run, {"content": "reminder"})[0].ok
    assert len(rows(database_url)) == 1 and not suppressed(database_url, run.id)


def test_same_call_twice_writes_once(reg: ToolRegistry, make_run: Callable[..., Run], database_url: str) -> None:
    run = make_run()
    _, first = send(reg, run, {"content": "once"})
    _, again = send(reg, run, {"content": "once"})
    assert len(rows(database_url)) == 1 and again.followups == first.followups  # the same row, never a second


def test_a_call_id_the_model_reuses_in_a_later_step_sends_a_new_message(
        reg: ToolRegistry, make_run: Callable[..., Run], database_url: str) -> None:
    """Some models reuse call ids: the second message shared the first one's outbox key, so it was
    dropped (and the final reply suppressed), or only its later chunks went out (helper's review)."""
    run = make_run()
    long = "\n\n".join(f"Paragraph {i} " + "x" * 1500 for i in range(4))  # several Telegram chunks
    for step, content in ((1, "Working on it."), (3, long)):
        with Session(get_engine(database_url)) as s:  # the journal row of the executing call
            s.add(ToolCall(run_id=run.id, step_seq=step, call_id="call_0", name="message"))
            s.commit()
        assert send(reg, run, {"content": content}, call_id="call_0")[0].ok
    messages: dict[str, list[str]] = {}  # outbox key of a message -> its chunks in order
    for row in sorted(rows(database_url), key=lambda r: int(r.meta["chunk"])):
        messages.setdefault(row.key.rsplit(":", 1)[0], []).append(row.content)
    assert sorted("".join(chunks).replace("\n", "") for chunks in messages.values()) == \
        sorted(["Working on it.", long.replace("\n", "")])


def test_api_channel_answers_in_the_result(reg: ToolRegistry, make_run: Callable[..., Run],
                                           database_url: str) -> None:
    run = make_run(origin={"channel": "api", "chat_id": "conv-1"})
    result, _ = send(reg, run, {"content": "hello there"})
    assert result.ok and result.output["content"] == "hello there" and result.output["channel"] == "api"
    assert rows(database_url) == [] and not suppressed(database_url, run.id)


def test_bad_targets_are_refused_without_a_row(reg: ToolRegistry, make_run: Callable[..., Run],
                                               database_url: str) -> None:
    run = make_run()
    assert send(reg, run, {"content": "x", "channel": "myspace", "chat_id": "1"})[0].error == ErrorCode.INVALID_ARGS
    assert send(reg, run, {"content": "x", "channel": "slack"})[0].error == ErrorCode.INVALID_ARGS
    assert send(reg, run, {"content": ""})[0].error == ErrorCode.INVALID_ARGS
    off = send(reg, run, {"content": "x", "channel": "discord", "chat_id": "1"})[0]
    assert off.error == ErrorCode.FAILED and "NANOFLEET_CHANNELS__DISCORD__" in off.message
    assert rows(database_url) == [] and not suppressed(database_url, run.id)


def test_not_allowed_sends_nothing(database_url: str, workspace: Path, make_run: Callable[..., Run]) -> None:
    clean_db(database_url)
    settings = configured(tool_settings(workspace, allowed=["time"]), database_url)
    run = make_run()
    result = call(build_registry(settings), "message", {"content": "x"}, run_id=run.id, channel="telegram",
                  chat_id="42")
    assert result.status == "REJECTED" and rows(database_url) == []


def test_a_chat_id_the_platform_cannot_have_is_refused_at_once(database_url: str, workspace: Path,
                                                               make_run: Callable[..., Run]) -> None:
    """A Discord chat id is a snowflake: `../guilds/1` is refused by the tool, not queued and dead-lettered."""
    clean_db(database_url)
    settings = configured(tool_settings(workspace, allowed=["message"], granted=[]), database_url)
    channels = settings.channels.model_validate({**CHANNELS, "discord": {
        "application_id": "1234", "public_key": "ab" * 32, "bot_token": "discord-test-token"}})
    tools = settings.tools.model_copy(update={"message": MessageSettings(send_to=["discord:*"])})
    reg = build_registry(settings.model_copy(update={"channels": channels, "tools": tools}))
    run = make_run()
    refused = send(reg, run, {"content": "x", "channel": "discord", "chat_id": "../guilds/1"})[0]
    assert refused.error == ErrorCode.INVALID_ARGS and "snowflake" in refused.message
    assert rows(database_url) == []
    assert send(reg, run, {"content": "x", "channel": "discord", "chat_id": "123456789012345678"}, "call_2")[0].ok
    assert [r.chat_id for r in rows(database_url)] == ["123456789012345678"]
