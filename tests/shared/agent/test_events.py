"""Streamed text deltas are sent as they come, but not a write per token."""

from __future__ import annotations

from typing import Any

import pytest

from shared.agent import events
from shared.agent.events import DELTA_EVERY, TEXT_DELTA, Deltas


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def publish(self, conversation_id: str, event: str, data: dict[str, Any]) -> None:
        self.events.append((conversation_id, event, data))

    def publish_watched(self, conversation_id: str, events: list[tuple[str, dict[str, Any]]]) -> bool:
        for event, data in events:
            self.publish(conversation_id, event, data)
        return True

    def texts(self) -> list[str]:
        return [d["text"] for _, _, d in self.events]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(events.time, "monotonic", lambda: now[0])
    return now


def test_a_fast_stream_is_sent_in_pieces_and_nothing_is_lost(clock: list[float]) -> None:
    sink = Recorder()
    deltas = Deltas(sink, "conv-1", "run-1")
    deltas("Hel")
    assert sink.texts() == ["Hel"]  # the first piece is not held back
    tokens = [f"token{i} " for i in range(2000)]
    for token in tokens:
        deltas(token)
        clock[0] += DELTA_EVERY / 100  # 2000 tokens in a second
    deltas.flush()
    assert {(c, e, d["run_id"]) for c, e, d in sink.events} == {("conv-1", TEXT_DELTA, "run-1")}
    assert "".join(sink.texts()) == "Hel" + "".join(tokens)
    assert 15 <= len(sink.events) <= 25  # a write per DELTA_EVERY, not per token
    sent = len(sink.events)
    deltas.flush()
    assert len(sink.events) == sent  # nothing was left pending


def test_a_slow_stream_is_sent_piece_by_piece(clock: list[float]) -> None:
    sink = Recorder()
    deltas = Deltas(sink, "conv-1", "run-1")
    for piece in ("a", "b", "c"):
        deltas(piece)
        clock[0] += DELTA_EVERY * 1.2  # a model slower than the window
    deltas.flush()
    assert sink.texts() == ["a", "b", "c"]
