"""Discord shows each /ask "thinking..." until something is sent for its interaction. A second /ask
that joins a running turn (the mailbox) and a turn that is stopped get theirs replaced too, end to
end: the fake Discord, the gateway, a real worker and the fake LLM."""

from __future__ import annotations

from typing import Any

from shared.agent.finish import JOINED, STOPPED
from tests.fakes.llm import FakeLLM
from tests.support.platforms import ChannelStack
from tests.support.processes import wait_until


def _ask(channels: ChannelStack, chat: str, text: str, interaction: str) -> dict[str, Any]:
    discord, d = channels.fakes["discord"], channels.driver("discord")
    payload: dict[str, Any] = discord.command(channel=chat, user=d.allowed, text=text, interaction_id=interaction)
    r = channels.post("discord", discord.signed(payload))
    assert r.status_code == 200 and r.json() == {"type": 5}, r.text
    return payload


def _edits(channels: ChannelStack, chat: str) -> dict[str, str]:
    """Interaction token -> what its "thinking..." became."""
    calls = channels.fakes["discord"].sent(chat)
    assert all(c.op == "edit_original" for c in calls), [(c.op, c.body) for c in calls]
    edits = {c.path.split("/")[3]: str(c.body["content"]) for c in calls}
    assert len(edits) == len(calls), "an interaction's response was edited twice"
    return edits


def _llm_busy(fake_llm: FakeLLM) -> None:
    wait_until(lambda: fake_llm.in_flight == 1, timeout=20, message="the first turn's LLM call")


def test_a_second_ask_that_joins_the_running_turn_is_told_where_its_answer_is(
    channels: ChannelStack, fake_llm: FakeLLM
) -> None:
    chat = channels.driver("discord").new_chat()
    first = _ask(channels, chat, "sleep:2\ncall:time", "I1")  # a tool call: the turn asks the model again
    _llm_busy(fake_llm)
    second = _ask(channels, chat, "and what day is it?", "I2")
    channels.settled(chat, rows=2)
    edits = _edits(channels, chat)
    assert edits == {first["token"]: "echo: and what day is it?", second["token"]: JOINED}
    assert channels.scalar("select count(*) from runs") == 1  # the second question went into the first turn


def test_a_stopped_turn_says_so_where_it_was_thinking(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    chat = channels.driver("discord").new_chat()
    first = _ask(channels, chat, "sleep:3\ncall:time", "I1")
    _llm_busy(fake_llm)
    stop = _ask(channels, chat, "/stop", "I2")
    channels.settled(chat, rows=2)
    assert _edits(channels, chat) == {first["token"]: STOPPED, stop["token"]: "Stopped 1 running task(s)."}
    assert channels.scalar("select status from runs") == "cancelled"


def test_one_ask_is_answered_with_no_note(channels: ChannelStack) -> None:
    """The note is only for a placeholder the reply does not replace."""
    chat = channels.driver("discord").new_chat()
    first = _ask(channels, chat, "call:time", "I1")
    channels.settled(chat)
    [(token, text)] = _edits(channels, chat).items()
    assert token == first["token"] and text.startswith("done: ")
