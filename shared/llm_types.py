"""What the LLM client (shared.llm) answers: the model's text and tool calls with their usage, or
the error a user may be shown."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LLMToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text, validated by the registry


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0


@dataclass
class LLMResponse:
    content: str
    tool_calls: list[LLMToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    model: str = ""


class LLMError(Exception):
    """The model refused the call, or could not be reached within the retries (the message says how
    many tries); `user_message` is safe to show."""

    def __init__(self, message: str, *, user_message: str) -> None:
        super().__init__(message)
        self.user_message = user_message
