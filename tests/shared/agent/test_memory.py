"""The token guard: a prompt that would overflow the context window is trimmed safely."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.agent import memory
from shared.agent.runtime import Runtime
from shared.settings import load_settings
from tests.fakes.llm import unpaired


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
    fitted, kept = memory.fit(rt, original, None)
    assert kept == len(fitted) - 2
    assert rt.llm.count_tokens(fitted) <= 5500
    assert fitted[0] == original[0] and fitted[-1] == original[-1]  # system prompt and context kept
    assert fitted[1]["role"] != "tool" and unpaired(fitted) is None
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
    assert memory.fit(rt, msgs, None) == (msgs, None)
    fitted, kept = memory.fit(rt, msgs, None, tools)
    assert kept is not None and rt.llm.count_tokens(fitted, None, tools) <= 5500


def test_fit_counts_a_photo_as_image_tokens_not_as_its_base64() -> None:
    """A photo's data URL is megabytes of base64 the model never reads as text: it counts IMAGE_TOKENS."""
    rt = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini", "context_window": 6000, "max_tokens": 500}))
    photo = {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + "A" * 400_000}}
    msgs = [*conversation(3), {"role": "user", "content": [{"type": "text", "text": "what is this?"}, photo]},
            {"role": "user", "content": "[runtime context, not written by the user]"}]
    assert memory.fit(rt, msgs, None) == (msgs, None)  # about 1,600 tokens and a photo: under 5,500
    crowded = [*conversation(9), *msgs[-2:]]  # about 4,800 tokens of text: over with the photo's
    fitted, kept = memory.fit(rt, crowded, None)  # the oldest history goes, the photo stays
    assert kept is not None and fitted[-2] == msgs[-2]


def test_fit_leaves_a_small_prompt_alone() -> None:
    rt = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini", "context_window": 128_000}))
    msgs = conversation(2)
    assert memory.fit(rt, msgs, None) == (msgs, None)


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
    assert memory.fit(rt, msgs, None) == (msgs, None)


@pytest.mark.parametrize("strategy", ["hard_trim", "sliding_window", "summarize"])
def test_the_request_being_answered_is_never_cut(strategy: str) -> None:
    """However long its tool results, the newest user message stays, and every tool call keeps
    its answer: the results are shortened, then the oldest rounds after the request dropped."""
    rt = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini", "context_window": 1500, "max_tokens": 500},
                                     memory={"context_strategy": strategy}))
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "web_fetch", "arguments": "{}"}}
             for i in range(3)]
    rounds = [[{"role": "assistant", "content": None, "tool_calls": calls[i:i + 1]},
               {"role": "tool", "tool_call_id": f"c{i}", "name": "web_fetch", "content": f"page {i} " * 1500}]
              for i in range(3)]
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "earlier"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "please fetch three pages"},
            *[m for r in rounds for m in r], {"role": "user", "content": "[runtime context]"}]
    fitted, kept = memory.fit(rt, msgs, None)
    assert kept == len(fitted) - 2 and rt.llm.count_tokens(fitted) <= 1000
    assert "please fetch three pages" in [m["content"] for m in fitted]
    assert "earlier" not in [m["content"] for m in fitted]
    assert unpaired(fitted) is None
    assert fitted[-2]["tool_call_id"] == "c2"  # the newest round stays


def test_one_message_over_the_budget_is_shortened() -> None:
    rt = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini", "context_window": 1500, "max_tokens": 500}))
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "word " * 5000 + "END"},
            {"role": "user", "content": "[runtime context]"}]
    fitted, kept = memory.fit(rt, msgs, None)
    assert kept == 1 and rt.llm.count_tokens(fitted) <= 1000
    assert "characters trimmed ...]" in fitted[1]["content"] and fitted[1]["content"].endswith("END")


def test_a_long_tool_result_is_cut_to_what_fits_and_keeps_its_end() -> None:
    """Cut to the room there is, not to 2,000 characters whatever the window: and its end, where
    read_file says how to read on, stays."""
    rt = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini", "context_window": 8192}))
    call = {"id": "c0", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    result = "a line of a long file\n" * 2000 + "(read on from start_line 2001)"
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "read big.txt"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "name": "read_file", "content": result},
            {"role": "user", "content": "[runtime context]"}]
    fitted, _ = memory.fit(rt, msgs, None)
    cut = fitted[3]["content"]
    assert rt.llm.count_tokens(fitted) <= rt.llm.prompt_budget() and "characters trimmed" in cut
    assert cut.endswith("(read on from start_line 2001)") and len(cut) > 8000


def test_a_long_caption_of_a_photo_is_shortened_too() -> None:
    """A request with a photo is a list of parts: its text was never cut, and the prompt overflowed."""
    rt = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini", "context_window": 16_000}))
    photo = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 1000}}
    msgs = [{"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "word " * 14_000 + "END"}, photo]},
            {"role": "user", "content": "[runtime context]"}]
    fitted, _ = memory.fit(rt, msgs, None)
    text, shown = fitted[1]["content"]
    assert "characters trimmed" in text["text"] and text["text"].endswith("END") and shown == photo
    assert memory._tokens(rt, fitted, None, None) <= rt.llm.prompt_budget()


def test_a_small_context_window_keeps_its_history() -> None:
    """A 4,096-token model (a small local one) and no max_tokens: the answer's room is a quarter of the
    window, not 4,096 tokens, which left no room for any history."""
    rt = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini", "context_window": 4096}))
    msgs = conversation(1)
    assert rt.llm.prompt_budget() == 3072
    assert memory.fit(rt, msgs, None) == (msgs, None)


def test_an_unset_context_window_is_the_models_own_at_most_128000() -> None:
    rt = Runtime.build(load_settings(llm={"model": "gpt-4", "profiles": {
        "big": {"model": "openai/gpt-4.1-mini"}, "own": {"model": "openai/a-model-litellm-does-not-know"},
        "set": {"model": "gpt-4", "context_window": 6000, "max_tokens": 1000}}}))
    assert rt.llm.prompt_budget() == 8192 - 2048  # litellm's figure for gpt-4
    assert rt.llm.prompt_budget("big") == rt.llm.prompt_budget("own") == 128_000 - 4096
    assert rt.llm.prompt_budget("set") == 5000


_RT = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini"}))


@pytest.mark.parametrize("strategy", ["hard_trim", "sliding_window", "summarize"])
def test_a_long_request_that_fits_is_never_shortened(strategy: str) -> None:
    """`hard_trim` shortened every message at once, the request too, though dropping older history
    would have made room: the end of the question never reached the model."""
    rt = Runtime.build(load_settings(llm={"model": "openai/gpt-4o-mini", "context_window": 7000, "max_tokens": 1000},
                                     memory={"context_strategy": strategy}))
    request = "the quick brown fox jumps over the lazy dog " * 130 + "REQUEST-END please answer"
    msgs = [*conversation(12)[:-1], {"role": "user", "content": request},
            {"role": "user", "content": "[runtime context, not written by the user]"}]
    fitted, kept = memory.fit(rt, msgs, None)
    assert kept is not None and rt.llm.count_tokens(fitted) <= 6000
    assert fitted[-2]["content"] == request
