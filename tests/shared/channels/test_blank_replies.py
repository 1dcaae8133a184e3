"""A reply that shows nothing once formatted (the model answered an empty code block) still reaches the
user, as the notice a turn that answered nothing gets; on Discord it replaces "thinking...". End to
end: the fake platforms, the gateway, a real worker and the fake LLM."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from shared.constants import EMPTY_ANSWER
from tests.fakes.llm import FakeLLM, Reply
from tests.support.platforms import ChannelStack, started_channel_stack


@pytest.fixture(scope="module")
def channel_stack(database_url: str, redis_server: str, fake_llm: FakeLLM,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChannelStack]:
    """The channel stack of the other webhook tests, its model allowed the message tool."""
    with started_channel_stack(database_url, redis_server, fake_llm, tmp_path_factory.mktemp("blank-replies"),
                               TOOLS__ALLOWED=json.dumps(["message"])) as stack:
        yield stack


def _thinking_became(channels: ChannelStack, chat: str) -> list[str]:
    """What Discord's "thinking..." was edited into; nothing else was sent."""
    calls = channels.fakes["discord"].sent(chat)
    assert [c.op for c in calls] == ["edit_original"], [(c.op, c.body) for c in calls]
    return [str(c.body["content"]) for c in calls]


@pytest.mark.parametrize(("name", "answer"), [("telegram", "```json\n```"), ("slack", "```\n\n```\n"),
                                              ("discord", "```json\n```")])
def test_an_empty_code_block_answer_is_told_as_an_empty_answer(channels: ChannelStack, fake_llm: FakeLLM,
                                                               name: str, answer: str) -> None:
    """Formatted, it has no chunk: it made no outbox row, so the user got nothing at all, and on Discord
    the turn counted as answered, its "thinking..." left until Discord gave up on it."""
    fake_llm.handler = lambda body: Reply(text=answer)
    d = channels.driver(name)
    chat = d.new_chat()
    assert channels.post(name, d.request(chat=chat, text="the config as json")).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [EMPTY_ANSWER]
    if name == "discord":
        assert _thinking_became(channels, chat) == [EMPTY_ANSWER]


def test_an_empty_code_block_sent_with_the_message_tool_still_ends_the_thinking(channels: ChannelStack) -> None:
    """The message tool's text replaces the turn's reply: a text that makes no row left the placeholder."""
    d = channels.driver("discord")
    chat = d.new_chat()
    ask = 'call:message {"content": "```json\\n```"}'
    assert channels.post("discord", d.request(chat=chat, text=ask)).status_code == 200
    channels.settled(chat)
    assert _thinking_became(channels, chat) == [EMPTY_ANSWER]
