"""What every fake chat platform shares: a Starlette app on loopback (real HTTP) that records each
call, answers scripted replies first (a 429, a 500...), can be slowed down, and lists the requests it
refused the way the real platform would (bad token, bad payload)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.server import ThreadServer

Handler = Callable[[dict[str, Any], Request], tuple[int, Any]]


@dataclass
class Call:
    """One request the fake received; `status` is set once it answered."""

    op: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int | None = None


@dataclass(frozen=True)
class Upload:
    """A file part of a multipart request: the name and type the client gave, and its bytes."""

    filename: str
    content_type: str
    data: bytes


@dataclass
class Scripted:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


class FakePlatform:
    """Base of the fakes: subclasses list their routes and handle each operation."""

    message_ops: tuple[str, ...] = ()  # the operations that put a message in front of a user

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[Call] = []
        self.refused: list[str] = []
        self.delay = 0.0  # seconds each successful message send waits (after recording the call)
        self._script: list[tuple[str, Scripted]] = []
        self.server = ThreadServer(Starlette(routes=self.routes()))

    def routes(self) -> list[Route]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> FakePlatform:
        self.server.start()
        return self

    def reset(self) -> None:
        with self.lock:
            self.calls.clear()
            self.refused.clear()
            self._script.clear()
            self.delay = 0.0

    def script(self, op: str, status: int, body: Any, headers: dict[str, str] | None = None, times: int = 1) -> None:
        """The next `times` calls of `op` get this answer instead of the normal one."""
        with self.lock:
            self._script += [(op, Scripted(status, body, headers or {}))] * times

    def refuse(self, why: str) -> None:
        with self.lock:
            self.refused.append(why)

    def sent(self, chat: str | None = None) -> list[Call]:
        """Messages that reached a user (answered 2xx), in arrival order; `chat` filters."""
        with self.lock:
            return [c for c in self.calls if c.op in self.message_ops and c.status is not None and c.status < 300
                    and (chat is None or self.chat_of(c) == chat)]

    def arrived(self, chat: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.op in self.message_ops and self.chat_of(c) == chat]

    def chat_of(self, call: Call) -> str:
        raise NotImplementedError

    def text_of(self, call: Call) -> str:
        raise NotImplementedError

    def texts(self, chat: str) -> list[str]:
        return [self.text_of(c) for c in self.sent(chat)]

    def received_files(self, chat: str) -> list[tuple[str, bytes]]:
        """The files that reached a user in `chat` (their name and bytes), in arrival order."""
        raise NotImplementedError

    async def answer(self, op: str, request: Request, handler: Handler) -> Response:
        """Record the call, then answer a scripted reply if one waits for `op`, else `handler`'s."""
        raw = await request.body()
        kind = request.headers.get("content-type", "")
        if kind.startswith("multipart/form-data"):
            body = await _form(request)
        elif kind.startswith("application/x-www-form-urlencoded"):
            body = dict(parse_qsl(raw.decode(errors="replace"), keep_blank_values=True))
        else:
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {"_raw": raw.decode(errors="replace")}
        call = Call(op, request.url.path, dict(request.headers), body)
        with self.lock:
            self.calls.append(call)
            scripted = next((i for i, (o, _) in enumerate(self._script) if o == op), None)
            reply = self._script.pop(scripted)[1] if scripted is not None else None
        if reply is None:
            status, payload = handler(body, request)
            if status < 300 and self.delay and op in self.message_ops:
                await asyncio.sleep(self.delay)
            reply = Scripted(status, payload)
        call.status = reply.status
        if isinstance(reply.body, bytes):  # a file the platform hands out
            return Response(reply.body, status_code=reply.status, headers=reply.headers,
                            media_type="application/octet-stream")
        return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)


async def _form(request: Request) -> dict[str, Any]:
    """A multipart upload's fields: text as str, each file as an Upload."""
    out: dict[str, Any] = {}
    async with request.form() as form:
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                out[key] = Upload(value.filename or "", value.content_type or "", await value.read())
            else:
                out[key] = value
    return out
