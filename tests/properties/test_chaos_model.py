"""The chaos run's oracle (bench/chaos_check.py): whatever order messages arrive in, however many are
folded into one turn, and however short the history window, the fake model calls `record` once per
tag and names every tag and report in exactly one answer. A wrong oracle would turn into false
losses or duplicates in `make chaos`, so it is checked here on its own."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.chaos_check import MENTION, TAG, handler, message_text

SYSTEM = {"role": "system", "content": "You are nanofleet."}


def _prompt(transcript: list[dict[str, Any]], turn_start: int, window: int) -> list[dict[str, Any]]:
    """What the runtime sends: the last `window` messages before this turn (never starting with a tool
    result) plus every message of the current turn (shared/agent/prompt.py)."""
    earlier = transcript[max(0, turn_start - window):turn_start]
    while earlier and earlier[0]["role"] == "tool":
        earlier.pop(0)
    return [SYSTEM, *earlier, *transcript[turn_start:]]


def _simulate(arrivals: list[int], kinds: list[str], window: int) -> list[dict[str, Any]]:
    """`arrivals[k]`: how many queued messages join before LLM step k (steer mode)."""
    model = handler(max_delay=0.0)
    queue = [message_text(i, kind) if kind != "report" else f"[subagent report] sub-{i} finished"
             for i, kind in enumerate(kinds)]
    transcript: list[dict[str, Any]] = []
    turn_start, steps, in_turn = 0, 0, False
    while queue or in_turn:
        joining = arrivals[steps % len(arrivals)] if in_turn else max(1, arrivals[steps % len(arrivals)])
        for content in queue[:joining]:
            transcript.append({"role": "user", "content": content})
        del queue[:joining]
        if not in_turn:
            in_turn = True
        reply = model({"messages": _prompt(transcript, turn_start, window)})
        model({"messages": _prompt(transcript, turn_start, window)})  # a replayed step: its answer is dropped
        steps += 1
        if reply.tool_calls:
            calls = [{"id": f"c{steps}-{n}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args)}}
                     for n, (name, args) in enumerate(reply.tool_calls)]
            transcript.append({"role": "assistant", "content": None, "tool_calls": calls})
            transcript += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
        else:
            transcript.append({"role": "assistant", "content": reply.text})
            in_turn, turn_start = False, len(transcript)
    return transcript


@settings(max_examples=200, deadline=None)
@given(kinds=st.lists(st.sampled_from(["record", "record", "spawn", "cron", "report"]), min_size=1, max_size=25),
       arrivals=st.lists(st.integers(0, 4), min_size=1, max_size=10), window=st.integers(2, 30))
def test_every_tag_is_recorded_once_and_answered_once(kinds: list[str], arrivals: list[int], window: int) -> None:
    transcript = _simulate(arrivals, kinds, window)
    recorded: Counter[str] = Counter()
    answered: Counter[str] = Counter()
    for m in transcript:
        for call in m.get("tool_calls") or []:
            if call["function"]["name"] == "record":
                recorded[json.loads(call["function"]["arguments"])["tag"]] += 1
        if m["role"] == "assistant" and m.get("content"):
            answered.update({f"tag-{n}" for n in TAG.findall(m["content"])})
            answered.update(set(MENTION.findall(m["content"])))
    tags = [f"tag-{i}" for i, kind in enumerate(kinds) if kind != "report"]
    reports = [f"sub-{i}" for i, kind in enumerate(kinds) if kind == "report"]
    assert all(recorded[t] == 1 for t in tags), recorded
    assert all(answered[x] == 1 for x in tags + reports), answered


def test_only_a_resend_of_one_row_right_after_a_kill_counts_as_the_send_mark_window() -> None:
    from bench.chaos_check import KILL_WINDOW, Received, window_resends

    sends = [Received(100.0, "c1", "done: tag-1"), Received(131.0, "c1", "done: tag-1"),  # resent, kill at 100.01
             Received(200.0, "c2", "done: tag-2 cron-7"), Received(230.0, "c2", "done: tag-2 cron-7"),  # no kill
             Received(300.0, "c3", "done: tag-3"), Received(300.5, "c3", "done: tag-3")]  # two rows: the runtime's
    rows = Counter({("c1", "done: tag-1"): 1, ("c2", "done: tag-2 cron-7"): 1, ("c3", "done: tag-3"): 2})
    assert window_resends(sends, rows, [100.01, 300.1]) == {"tag-1"}
    assert window_resends(sends, rows, [200.0 + KILL_WINDOW]) == {"tag-2", "cron-7"}
    assert window_resends(sends, rows, [200.0 + KILL_WINDOW + 0.1]) == set()
