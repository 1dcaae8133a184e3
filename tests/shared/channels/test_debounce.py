"""Debouncing (shared.channels.debounce), in-process: which messages join a burst, and what it becomes."""

from __future__ import annotations

from typing import Any

from shared.channels import debounce
from shared.contracts import InboundMessage
from shared.settings import Settings


def text(n: int, content: str = "", **kw: Any) -> InboundMessage:
    fields: dict[str, Any] = {"channel": "telegram", "sender_id": "1", "reply_meta": {"reply_to_message_id": n}, **kw}
    return InboundMessage(chat_id="-5", content=content or f"text {n}", event_id=str(n), **fields)


def test_plain_texts_of_one_sender_join_until_something_else_comes() -> None:
    burst, over = debounce.burst(text(1), [text(2), text(3)])
    assert ([m.event_id for m in burst], over) == (["1", "2", "3"], False)  # more may come
    one = debounce.joined(burst)
    assert (one.content, one.event_id, one.reply_meta) == ("text 1\ntext 2\ntext 3", "3", {"reply_to_message_id": 3})
    for stop in (text(3, sender_id="2"), text(3, "/stop"), text(3, media={"kind": "photo", "id": "p"}),
                 text(3, album="a1"), text(3, unsupported="a sticker"), text(3, " ")):
        burst, over = debounce.burst(text(1), [text(2), stop, text(4)])
        assert ([m.event_id for m in burst], over) == (["1", "2"], True), stop


def test_what_never_waits_for_more() -> None:
    assert debounce.joinable(text(1))
    assert not any(debounce.joinable(m) for m in (
        text(1, "/new"), text(1, "/retry with more detail"), text(1, images=[{"mime": "image/png", "data": "x"}]),
        text(1, notice="Sorry"), text(1, more_media=[{"kind": "file", "id": "f"}])))


def test_only_chat_platforms_debounce() -> None:
    settings = Settings(channels={"telegram": {"debounce": 1.5}, "whatsapp": {"debounce": 2}})
    assert [settings.channels.debounce(c) for c in ("telegram", "whatsapp", "slack", "discord", "webhook", "api")] == \
        [1.5, 2.0, 0.0, 0.0, 0.0, 0.0]


def test_without_a_debounce_only_what_looks_like_a_split_paste_waits() -> None:
    channels = Settings().channels
    long = "x" * debounce.SPLIT_AT["telegram"]
    assert [debounce.wait(channels, m) for m in (text(1), text(1, long), text(1, "/" + long))] == \
        [0.0, debounce.SPLIT_WAIT, 0.0]
    assert debounce.wait(channels, text(1, long, channel="slack")) == 0.0  # (Slack does not split)
    assert debounce.wait(Settings(channels={"telegram": {"debounce": 3}}).channels, text(1, long)) == 3.0


def test_a_burst_waits_for_a_pause_but_never_past_the_longest_hold() -> None:
    assert debounce.holding(2.0, False, quiet=0.5, first_age=10) == 1.5
    assert debounce.holding(2.0, False, quiet=2.5, first_age=10) == 0.0  # its sender paused
    assert debounce.holding(2.0, True, quiet=0.5, first_age=10) == 0.0  # something else came after it
    assert debounce.holding(2.0, False, quiet=0.5, first_age=debounce.LONGEST - 1) == 1.0
    assert debounce.holding(2.0, False, quiet=0.5, first_age=debounce.LONGEST + 5) == 0.0  # a sender who never stops
