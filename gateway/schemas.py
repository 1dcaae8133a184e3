"""Request and response bodies of the REST API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# Every /api/v1 route answers 401 without a valid bearer key; documented so clients (and schemathesis) know.
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {401: {"description": "missing or invalid API key"}}
BIGINT_MAX = 2**63 - 1  # offsets past Postgres' bigint are refused with 422, not a database error


class CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)


class ConversationIn(CamelModel):
    title: str | None = Field(default=None, max_length=200)


class ConversationOut(CamelModel):
    conversation_id: str


class ChatIn(CamelModel):
    message: str = Field(min_length=1, max_length=100_000)
    model: str | None = Field(default=None, max_length=200)


class ToolCallOut(CamelModel):
    tool_name: str
    status: str
    result: str
    call_id: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    error_code: str | None = None
    elapsed_ms: float = 0.0


class ChatOut(CamelModel):
    conversation_id: str
    assistant_message: str
    tool_calls: list[ToolCallOut] = Field(default_factory=list)
    run_id: str | None = None
    status: str = "succeeded"


class Accepted(CamelModel):
    conversation_id: str
    run_id: str | None
    message_id: int | None = None
    queued: bool = False
    reply: str | None = None


class MessageOut(CamelModel):
    id: int
    conversation_id: str
    role: str
    type: str
    content: str
    tool_name: str | None = None
    tool_call_id: str | None = None
    run_id: str | None = None
    pending: bool = False
    created_at: str
