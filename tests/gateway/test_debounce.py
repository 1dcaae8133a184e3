"""Debouncing (shared.channels.debounce), end to end: a Telegram chat whose texts wait a second for
their sender's next one; the gateway, a real worker and Postgres take them in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.agent.service import HELP
from tests.fakes.llm import FakeLLM
from tests.support.platforms import ChannelStack, started_channel_stack
from tests.support.processes import wait_until

WAIT = 1.0


@pytest.fixture(scope="module")
def channel_stack(database_url: str, redis_server: str, fake_llm: FakeLLM,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChannelStack]:
    with started_channel_stack(database_url, redis_server, fake_llm, tmp_path_factory.mktemp("debounce"),
                               CHANNELS__TELEGRAM__DEBOUNCE=str(WAIT)) as stack:
        yield stack


def said(channels: ChannelStack, chat: str) -> list[str]:
    """The chat's messages to the agent, in order."""
    return list(channels.scalar(
        "select coalesce(json_agg(m.content order by m.seq), '[]') from messages m join conversations c "
        "on c.id = m.conversation_id where c.chat_id = :c and m.role = 'USER'", c=chat))


def test_texts_sent_in_a_burst_are_one_message_answered_once(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """A long paste Telegram split in three, or a person who writes in bursts: each part was answered
    on its own, the first before the rest had come."""
    d, calls = channels.driver("telegram"), fake_llm.calls()
    chat = d.new_chat()
    for part in ("part one", "part two", "part three"):
        assert channels.post("telegram", d.request(chat=chat, text=part)).status_code == 200
    channels.settled(chat)
    assert said(channels, chat) == ["part one\npart two\npart three"]
    assert d.replies(chat) == ["echo: part one\npart two\npart three"]
    assert fake_llm.calls() == calls + 1


def test_a_command_is_never_held_or_joined_and_ends_the_burst_before_it(channels: ChannelStack,
                                                                         fake_llm: FakeLLM) -> None:
    d, calls = channels.driver("telegram"), fake_llm.calls()
    chat = d.new_chat()
    for text in ("before", "/help", "after"):
        assert channels.post("telegram", d.request(chat=chat, text=text)).status_code == 200
    wait_until(lambda: said(channels, chat) == ["before", "after"], message="both texts taken in, apart")
    channels.settled(chat, rows=3)
    assert sorted(d.replies(chat)) == sorted(["echo: before", HELP.replace("<", "&lt;").replace(">", "&gt;"),
                                              "echo: after"])
    assert fake_llm.calls() == calls + 2


def test_a_burst_goes_on_once_its_sender_pauses(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """What comes after the pause is a message of its own (another sender's, a photo's: in-process,
    tests/shared/channels/test_debounce.py)."""
    d = channels.driver("telegram")
    chat = d.new_chat()
    assert channels.post("telegram", d.request(chat=chat, text="first")).status_code == 200
    wait_until(lambda: said(channels, chat) == ["first"], message="the first taken in after the pause")
    assert channels.post("telegram", d.request(chat=chat, text="second")).status_code == 200
    wait_until(lambda: said(channels, chat) == ["first", "second"], message="the second taken in on its own")
    channels.settled(chat, rows=2)
