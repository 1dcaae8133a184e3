"""The token guard: a prompt that would overflow the context window is trimmed safely."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.agent import memory
from shared.agent.runtime import Runtime
from shared.settings import load_settings


def conversation(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "you are helpful"}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"question {i} " + "words " * 200})
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "time", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "name": "time", "content": "t " * 300})
        msgs.append({"role": "assistant", "content": f"answer {i}"})
    msgs.append({"role": "user", "content": "[runtime context, not written by the user]"})
    return msgs


@pytest.mark.parametrize("strategy", ["hard_trim", "sliding_window", "summarize"])
def test_fit_trims_to_the_budget_without_orphans(strategy: str) -> None:
    settings = load_settings(llm={"model": "openai/gpt-4o-mini", "context_window": 6000, "max_tokens": 500},
                             memory={"context_strategy": strategy})
    rt = Runtime.build(settings)
    original = conversation(20)
    fitted, trimmed = memory.fit(rt, original, None)
    assert trimmed
    assert rt.llm.count_tokens(fitted) <= 5500
    assert fitted[0] == original[0] and fitted[-1] == original[-1]  # system prompt and context kept
    assert fitted[1]["role"] != "tool"
    assert fitted[-2]["content"] == "answer 19"  # the newest history survives


def test_fit_counts_the_tool_schemas_sent_with_the_prompt() -> None:
    """Tool definitions go with every call: a prompt that fits alone may not fit with them."""
    rt = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini", "context_window": 6000, "max_tokens": 500}))
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does things " * 200,
                                               "parameters": {"type": "object", "properties": {}}}}
             for i in range(10)]
    msgs = conversation(4)
    alone = rt.llm.count_tokens(msgs)
    assert alone <= 5500 < rt.llm.count_tokens(msgs, None, tools)
    assert memory.fit(rt, msgs, None) == (msgs, False)
    fitted, trimmed = memory.fit(rt, msgs, None, tools)
    assert trimmed and rt.llm.count_tokens(fitted, None, tools) <= 5500


def test_fit_leaves_a_small_prompt_alone() -> None:
    rt = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini", "context_window": 128_000}))
    msgs = conversation(2)
    assert memory.fit(rt, msgs, None) == (msgs, False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=400), min_size=1, max_size=8))
def test_the_byte_bound_never_undercounts(texts: list[str]) -> None:
    """`fit` skips the tokenizer when the prompt's bytes fit: that is only safe if bytes >= tokens."""
    rt = _RT
    msgs: list[dict[str, Any]] = [{"role": "user" if i % 2 else "assistant", "content": t} for i, t in enumerate(texts)]
    assert rt.llm.count_tokens(msgs) <= memory._bytes(msgs)


def test_a_prompt_over_the_byte_bound_is_still_counted() -> None:
    """Bytes over the budget but tokens under it: counted, and left alone."""
    rt = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini", "context_window": 1500, "max_tokens": 100}))
    msgs = [{"role": "user", "content": "hello " * 300}]  # about 1,800 bytes, about 300 tokens
    assert memory._bytes(msgs) > 1400 >= rt.llm.count_tokens(msgs)
    assert memory.fit(rt, msgs, None) == (msgs, False)


_RT = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini"}))
