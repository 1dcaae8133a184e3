"""Request and response bodies of the REST API."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

from fastapi import Path
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic.alias_generators import to_camel

from shared.channels.base import IMAGE_TYPES, MAX_IMAGE, MAX_IMAGES, image_type
from shared.contracts import BLANKS, NO_NUL, NOT_BLANK, not_blank

MAX_MESSAGE = 100_000  # characters
# A photo as a data URL: "data:image/jpeg;base64," (the longest head) and MAX_IMAGE bytes in base64,
# four characters for every three bytes begun.
IMAGE_URL_CHARS = len("data:image/jpeg;base64,") + 4 * -(-MAX_IMAGE // 3)
# The largest body the REST API reads (gateway/app.py answers 413 past it, before reading): what
# .../chat and .../messages take, MAX_IMAGES photos of the largest size with the longest message.
# Four 5 MiB photos are 26.7 MiB as data URLs; the longest message, written as JSON \u escapes of
# characters outside the BMP (12 bytes each), 1.1 MiB: 27.8 MiB with the keys and the model. The rest
# of 30 MiB is room for JSON written looser (whitespace, "/" escaped as "\/": 1/64 of base64 on average).
MAX_BODY = 30 * 1024 * 1024
# Every other route's body has no photos: the most any holds is a message (1.1 MiB escaped), well within 8 MiB.
MAX_BODY_WITHOUT_IMAGES = 8 * 1024 * 1024

# Every /api/v1 route answers 401 without a valid bearer key; documented so clients (and schemathesis) know.
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {401: {"description": "missing or invalid API key"}}
# A body that is not JSON, or not the model, is a 422 (FastAPI documents that one itself).
BAD_BODY: dict[int | str, dict[str, Any]] = {
    400: {"description": "the body cannot be read as JSON: not UTF-8, nested too deep, or a number too long"},
    413: {"description": f"the body is over {MAX_BODY_WITHOUT_IMAGES // 2**20} MiB ({MAX_BODY // 2**20} MiB "
                          "for POST .../chat and .../messages, which take photos)"},
}
BIGINT_MAX = 2**63 - 1  # offsets past Postgres' bigint are refused with 422, not a database error


# Postgres text cannot hold NUL: refuse it with 422 instead of failing in the database. A pattern,
# not a validator, so the OpenAPI schema says so too.
Text = Annotated[str, StringConstraints(pattern=NO_NUL)]
# Words, nor blank (shared.contracts.Said), with their length limit on the string itself: a limit given
# in the field's Field() applies after the blank check, and pydantic then counts "items", not characters.
Title = Annotated[str, StringConstraints(pattern=NO_NUL, max_length=200), AfterValidator(not_blank),
                  Field(json_schema_extra={"pattern": NOT_BLANK})]
Words = Annotated[str, StringConstraints(pattern=NO_NUL, min_length=1, max_length=MAX_MESSAGE),
                  AfterValidator(not_blank), Field(json_schema_extra={"pattern": NOT_BLANK})]
JobMessage = Annotated[str, StringConstraints(pattern=NO_NUL, min_length=1, max_length=10_000),
                       AfterValidator(not_blank), Field(json_schema_extra={"pattern": NOT_BLANK})]  # a cron job's
Id = Annotated[str, Path(max_length=64, pattern=r"^[^\x00]+$")]


class CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)


class RequestBody(CamelModel):
    """A request body: a key it does not know is a 422 that names it, not dropped (a misspelt
    field would otherwise take its default without a word)."""

    model_config = ConfigDict(extra="forbid")


class ConversationIn(RequestBody):
    title: Title | None = None


class ConversationOut(CamelModel):
    conversation_id: str


class ConversationPatch(RequestBody):
    title: Title | None = Field(description="the new title; null removes it")


class Usage(CamelModel):
    prompt_tokens: int
    completion_tokens: int
    cost: float = Field(description="USD, as the model's price map (or its profile) gives it")


class ConversationInfo(CamelModel):
    conversation_id: str
    title: str | None
    channel: str = Field(description="api, the chat platform it came from, cli (nanofleet agent), or "
                                     "internal (the session of a cron job, a subagent or the heartbeat)")
    chat_id: str
    active_run_id: str | None = Field(description="the turn running now, if any")
    usage: Usage = Field(description="the model calls of its runs, summed")
    created_at: str
    last_active_at: str


# A data URL of an image a model takes, its bytes starting as that type's do (the base64 of its magic
# number) and whole base64 after; the field's validator says which part a refused one gets wrong.
_B64 = "(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
IMAGE_URL = ("^data:image/(?:png;base64,iVBORw0KGg[o-r][A-Za-z0-9+/]|jpeg;base64,/9j/|gif;base64,R0lGOD[dl]h"
             f"|webp;base64,UklGR[g-v][A-Za-z0-9+/]{{4}}[BFJNRVZdhlptx159]XRUJQ){_B64}$")


class ChatIn(RequestBody):
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"required": ["message"], "properties": {"message": {"pattern": NOT_BLANK}}},
        {"required": ["images"], "properties": {"images": {"minItems": 1}}}]})

    message: Text = Field(default="", max_length=MAX_MESSAGE, description="the text; may be left out with images")
    images: list[Annotated[str, Field(max_length=IMAGE_URL_CHARS, json_schema_extra={"pattern": IMAGE_URL})]] = Field(
        default_factory=list, max_length=MAX_IMAGES, description=(
            "photos sent with the message, as data URLs (data:image/png;base64,...): JPEG, PNG, GIF or WebP, "
            "5 MB each at most; shown to the model of the turn that answers, if it sees images"))
    model: Text | None = Field(default=None, max_length=200, description=(
        "a profile name or a litellm model string (422 when NANOFLEET_LLM__ALLOWED_MODELS is set and it is "
        "neither the default, a profile, nor listed there)"))

    @field_validator("images")
    @classmethod
    def _images(cls, urls: list[str]) -> list[str]:
        for i, url in enumerate(urls):
            decoded_image(url, f"images[{i}]")
        return urls

    @model_validator(mode="after")
    def _said_something(self) -> ChatIn:
        if not self.message.strip(BLANKS) and not self.images:
            raise ValueError("message is empty or blank: send some text, or images")
        return self

    def photos(self) -> list[dict[str, str]]:
        """The images as messages keep them: {"mime", "data": base64}."""
        return [{"mime": mime, "data": data} for mime, data in (url[5:].split(";base64,", 1) for url in self.images)]


class RegenerateIn(RequestBody):
    message: Words | None = Field(default=None, description=(
        "the last user message as edited; left out, it is answered again as it was"))
    model: Text | None = Field(default=None, max_length=200, description=(
        "the model of the new answer (as for chat); left out, the one the message was sent with"))


def decoded_image(url: str, where: str) -> bytes:
    """The image a data URL holds; ValueError (naming `where`) unless it is one a model takes."""
    head, _, data = url.partition(";base64,")
    try:
        image = base64.b64decode(data, validate=True)
    except binascii.Error:
        image = b""
    if not head.startswith("data:image/") or not image:
        raise ValueError(f"{where} is not a data URL of a base64 image (data:image/png;base64,...)")
    if len(image) > MAX_IMAGE:
        raise ValueError(f"{where} is over {MAX_IMAGE:,} bytes")
    if image_type(image) != head[5:]:
        raise ValueError(f"{where} is no {', '.join(IMAGE_TYPES)} image, or not the type its URL says")
    return image


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


class TimedOut(CamelModel):
    """/chat got no answer in time; the run goes on."""

    detail: str
    conversation_id: str
    run_id: str | None = Field(description="the run handling the message; null while it waits its turn")


class Accepted(CamelModel):
    conversation_id: str
    run_id: str | None
    message_id: int | None = None
    queued: bool = False
    reply: str | None = None


class MessageOut(CamelModel):
    id: int
    seq: int = Field(description="position in the transcript: follow it with ?after= the largest seq of a "
                                 "NORMAL message that is not pending")
    conversation_id: str
    role: str
    type: str
    content: str
    tool_name: str | None = None
    tool_call_id: str | None = None
    run_id: str | None = None
    pending: bool = False
    images: int = Field(default=0, description="photos sent with the message (shown to the model that answered it)")
    created_at: str
