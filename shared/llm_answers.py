"""A model's answer, as litellm hands it over (a response, or the chunks of a stream), read into an
LLMResponse the runtime can store. No litellm here: shared.llm calls and prices, this reads."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from shared.contracts import without_nul
from shared.llm_types import LLMResponse, LLMToolCall, Usage


def answered(response: Any, model: str, cost: float) -> LLMResponse:
    """A whole response's text, tool calls and usage, priced at `cost`."""
    message = response.choices[0].message
    calls = [
        LLMToolCall(id=c.id, name=storable(c.function.name), arguments=storable(c.function.arguments or "{}"))
        for c in (message.tool_calls or [])
    ]
    usage = getattr(response, "usage", None)
    return LLMResponse(
        content=storable(message.content or ""),
        tool_calls=calls,
        usage=Usage(
            prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
            completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
            cost=cost,
        ),
        model=model,
    )


def streamed(stream: Any, on_delta: Callable[[str], None], model: str) -> LLMResponse:
    """Pass the text on as it comes and put the answer together: the text in order, each tool
    call's id, name and argument pieces by its index, and the usage the last chunk carries (asked
    for with `include_usage`); not priced. litellm's own `stream_chunk_builder` does the same at
    about a third of the cost of a whole streamed call."""
    text: list[str] = []
    calls: dict[int, LLMToolCall] = {}
    usage = None
    for chunk in stream:
        usage = getattr(chunk, "usage", None) or usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            text.append(delta.content)
            on_delta(delta.content)
        for piece in delta.tool_calls or ():
            call = calls.setdefault(piece.index or 0, LLMToolCall(id="", name="", arguments=""))
            call.id = piece.id or call.id
            if piece.function is not None:
                call.name = piece.function.name or call.name
                call.arguments += piece.function.arguments or ""
    tool_calls = [LLMToolCall(id=c.id or f"call_{uuid.uuid4().hex[:24]}", name=storable(c.name),
                              arguments=storable(c.arguments or "{}")) for _, c in sorted(calls.items())]
    return LLMResponse(content=storable("".join(text)), tool_calls=tool_calls, model=model,
                       usage=Usage(prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                                   completion_tokens=getattr(usage, "completion_tokens", 0) or 0))


def storable(text: str) -> str:
    """A model's text as Postgres can store it: a NUL or a lone surrogate (which a model may well
    write) failed the step that wrote it, five times, each after a paid call."""
    return str(without_nul(text, lone_surrogates=True))
