"""What the gateway stores of a platform's message: no NUL, no lone surrogate, whatever it sent; the
shortcut for values with neither (one scan of their repr) changes nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shared.contracts import InboundMessage, without_nul

# Strings a platform can send, weighted towards what the guard must catch and what may fool its shortcut
# (a backslash and "x00" or "ud800" written out, which a repr spells like the characters themselves).
TRICKY = st.sampled_from(["\x00", "\ud800", "\udfff", "\\x00", "\\ud800", "\\", "x00", "ud8", "é", "\U0001f600"])
TEXT = st.lists(st.one_of(st.text(max_size=5), TRICKY), max_size=6).map("".join)
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), TEXT),
                       lambda inner: st.one_of(st.lists(inner, max_size=4),
                                               st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)


def _walked(value: Any) -> Any:
    """The guard's meaning, spelled out: every string (keys too) cleaned, nothing else touched."""
    if isinstance(value, str):
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value if c != "\x00")
    if isinstance(value, dict):
        return {_walked(k): _walked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_walked(v) for v in value]
    return value


@given(JSONISH)
def test_every_string_loses_its_nul_and_lone_surrogates_and_nothing_else_changes(value: Any) -> None:
    assert without_nul(value, lone_surrogates=True) == _walked(value)


@given(TEXT, st.dictionaries(TEXT, TEXT, max_size=3))
def test_an_inbound_message_is_always_storable(content: str, meta: dict[str, str]) -> None:
    message = InboundMessage(channel="telegram", chat_id="1", sender_id="2", content=content, event_id="3",
                             reply_meta=meta)
    stored = message.model_dump_json()
    stored.encode("utf-8")  # raises on a lone surrogate
    assert "\x00" not in stored and "\\u0000" not in stored
