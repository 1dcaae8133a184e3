"""A fake OpenAI-compatible chat completions server (real HTTP, streaming and not).

Default behaviour, driven by the last user message so tests across processes can steer it:
- a line `call:NAME {json}` (one or more) asks for those tool calls;
- after tool results, it answers `done: <tool results>`;
- `sleep:SECONDS` delays the answer; otherwise it echoes `echo: <text>`.
Tests may replace `handler` to script anything else."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.server import ThreadServer

CALL_RE = re.compile(r"^call:(\w+)\s*(\{.*\})?\s*$", re.M)
SLEEP_RE = re.compile(r"sleep:([\d.]+)")


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status: int = 200  # anything else: an error answer
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] | None = None  # answered as it is, instead of a completion built from the above


SENDER_RE = re.compile(r"^\[[^\]\n]*\]: ")  # "[alice (42)]: ", who wrote a message in a group chat


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The newest user message's text, without the sender a group chat's messages start with."""
    for m in reversed(messages):
        if m.get("role") == "user" and not text_of(m.get("content")).startswith("[runtime context"):
            return SENDER_RE.sub("", text_of(m.get("content")), count=1)
    return ""


def text_of(content: Any) -> str:
    """A message's text; with content parts, each photo as "[image <type>, <bytes> bytes, <sha256 hex>]",
    read from its data URL as a vision model would."""
    if not isinstance(content, list):
        return str(content or "")
    said = []
    for part in content:
        if part.get("type") == "image_url":
            mime, data = _image(part)
            said.append(f"[image {mime}, {len(data)} bytes, {hashlib.sha256(data).hexdigest()}]")
        else:
            said.append(str(part.get("text", "")))
    return " ".join(said)


def bad_image(messages: list[dict[str, Any]]) -> str | None:
    """What OpenAI refuses in an image part: not a base64 data URL of JPEG, PNG, GIF or WebP."""
    for m in messages:
        content = m.get("content")
        for part in content if isinstance(content, list) else []:
            if part.get("type") == "image_url":
                try:
                    _image(part)
                except ValueError as err:
                    return str(err)
    return None


def _image(part: dict[str, Any]) -> tuple[str, bytes]:
    url = str((part.get("image_url") or {}).get("url", ""))
    found = re.fullmatch(r"data:(image/(?:jpeg|png|gif|webp));base64,([A-Za-z0-9+/=]+)", url)
    if not found:
        raise ValueError("Invalid image: expected a base64 data URL of a JPEG, PNG, GIF or WebP image")
    return found.group(1), base64.b64decode(found.group(2), validate=True)


def default_handler(body: dict[str, Any]) -> Reply:
    messages = body.get("messages", [])
    convo = [m for m in messages if not text_of(m.get("content")).startswith("[runtime context")]
    text = last_user_text(messages)
    sleep = SLEEP_RE.search(text)
    delay = float(sleep.group(1)) if sleep else 0.0
    if convo and convo[-1].get("role") == "tool":
        results = [str(m.get("content")) for m in convo if m.get("role") == "tool"]
        return Reply(text="done: " + " | ".join(results[-len(_trailing_tools(convo)):]), delay=delay)
    calls = [(name, json.loads(args or "{}")) for name, args in CALL_RE.findall(text)]
    if calls:
        return Reply(tool_calls=calls, delay=delay)
    if "Summarise the conversation" in text:
        return Reply(text="SUMMARY: " + text[-200:].replace("\n", " "))
    return Reply(text=f"echo: {text}", delay=delay)


def unpaired(messages: list[dict[str, Any]]) -> str | None:
    """What OpenAI refuses in a prompt's tool messages (Anthropic too): an assistant message with
    tool calls not followed at once by a tool message for each call, or a tool message that
    answers no call just before it. None when the prompt is well formed."""
    waiting: set[str] = set()
    for i, m in enumerate(messages):
        if m.get("role") == "tool":
            if m.get("tool_call_id") not in waiting:
                return f"messages.[{i}]: a tool message must answer a preceding message with 'tool_calls'"
            waiting.discard(str(m.get("tool_call_id")))
            continue
        if waiting:
            return (f"messages.[{i}]: an assistant message with 'tool_calls' must be followed by tool messages "
                    f"responding to each 'tool_call_id'; missing {sorted(waiting)}")
        waiting = {str(c.get("id")) for c in m.get("tool_calls") or []} if m.get("role") == "assistant" else set()
    return f"the prompt ends before tool messages for {sorted(waiting)}" if waiting else None


def _trailing_tools(convo: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in reversed(convo):
        if m.get("role") != "tool":
            break
        out.append(m)
    return out


class FakeLLM:
    """Records every request; answers with `handler` (thread-safe to swap between tests)."""

    def __init__(self) -> None:
        self.handler: Callable[[dict[str, Any]], Reply] = default_handler
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self._spans: list[tuple[float, float]] = []  # (start, end) of each answered call, time.monotonic()
        self._open: dict[int, float] = {}  # the calls not answered yet: their start
        self._ids = itertools.count()
        # Speech to text: the "audio" of the tests is the words themselves, in UTF-8; a status other
        # than 200 answers an error instead
        self.transcriptions: list[dict[str, Any]] = []  # model, filename and size of each request
        self.transcription_status = 200
        self.transcription_delay = 0.0  # seconds
        self.server = ThreadServer(Starlette(routes=[
            Route("/v1/chat/completions", self._complete, methods=["POST"]),
            Route("/chat/completions", self._complete, methods=["POST"]),
            Route("/v1/audio/transcriptions", self._transcribe, methods=["POST"]),
        ]))

    @property
    def url(self) -> str:
        return self.server.url + "/v1"

    def start(self) -> FakeLLM:
        self.server.start()
        return self

    def reset(self) -> None:
        with self.lock:
            self.handler = default_handler
            self.requests.clear()
            self.transcriptions.clear()
            self.transcription_status = 200
            self.transcription_delay = 0.0
            self._spans.clear()

    def calls(self) -> int:
        with self.lock:
            return len(self.requests)

    def mean_in_flight(self, t0: float, t1: float) -> float:
        """The calls open on average between time.monotonic() `t0` and `t1`: each call's time open in
        that span, summed, over its length (exact, not sampled)."""
        with self.lock:
            spans = [*self._spans, *((start, t1) for start in self._open.values())]
        open_for = sum(max(0.0, min(end, t1) - max(start, t0)) for start, end in spans)
        return open_for / (t1 - t0) if t1 > t0 else 0.0

    async def _complete(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ClientDisconnect:  # a worker killed while it sent the request (the benchmarks' hold test)
            return Response(status_code=499)
        with self.lock:
            self.requests.append(body)
        problem = unpaired(body.get("messages", [])) or bad_image(body.get("messages", []))
        if problem:
            err = {"error": {"message": f"Invalid parameter: {problem}", "type": "invalid_request_error",
                             "param": "messages", "code": None}}
            return JSONResponse(err, status_code=400)
        with self.lock:
            handler = self.handler
            self.in_flight += 1
            call = next(self._ids)
            self._open[call] = time.monotonic()
        try:
            reply = handler(body)
            if reply.delay:
                await asyncio.sleep(reply.delay)
        finally:
            with self.lock:
                self.in_flight -= 1
                self._spans.append((self._open.pop(call), time.monotonic()))
        if reply.status != 200:
            err = {"error": {"message": f"fake error {reply.status}", "type": "server_error"}}
            return JSONResponse(err, status_code=reply.status, headers=reply.headers)
        if reply.raw is not None:
            return JSONResponse(reply.raw)
        if body.get("stream"):
            return StreamingResponse(_stream(body, reply), media_type="text/event-stream")
        return JSONResponse(_completion(body, reply))


    async def _transcribe(self, request: Request) -> Response:
        form = await request.form()
        upload = form.get("file")
        audio = await upload.read() if isinstance(upload, UploadFile) else b""
        with self.lock:
            self.transcriptions.append({"model": form.get("model"), "filename": getattr(upload, "filename", None),
                                        "bytes": len(audio)})
            status, delay = self.transcription_status, self.transcription_delay
        await asyncio.sleep(delay)
        if status != 200:
            return JSONResponse({"error": {"message": f"fake error {status}", "type": "server_error"}},
                                status_code=status)
        return JSONResponse({"text": audio.decode(errors="replace")})


def _usage(body: dict[str, Any], reply: Reply) -> dict[str, int]:
    prompt = sum(len(str(m.get("content") or "")) for m in body.get("messages", [])) // 4 + 1
    completion = len(reply.text) // 4 + 1
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [{"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}} for name, args in reply.tool_calls]


def _completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = _tool_calls(reply)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
        "usage": _usage(body, reply),
    }


async def _stream(body: dict[str, Any], reply: Reply):  # type: ignore[no-untyped-def]
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": body.get("model", "fake")}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return "data: " + json.dumps({**base, "choices": [choice]}) + "\n\n"

    yield chunk({"role": "assistant", "content": ""})
    for i in range(0, len(reply.text), 16):
        yield chunk({"content": reply.text[i:i + 16]})
    for i, call in enumerate(_tool_calls(reply)):  # as OpenAI streams them: id and name, then the arguments in pieces
        args = call["function"]["arguments"]
        yield chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": ""}}]})
        for j in range(0, len(args), 8):
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": args[j:j + 8]}}]})
    yield chunk({}, "tool_calls" if reply.tool_calls else "stop")
    yield "data: " + json.dumps({**base, "choices": [], "usage": _usage(body, reply)}) + "\n\n"
    yield "data: [DONE]\n\n"
