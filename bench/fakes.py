"""Fake platform servers for the bench and chaos runs (real HTTP on loopback, in a thread)."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.fakes.server import ThreadServer


@dataclass(frozen=True)
class Sent:
    """One sendMessage the fake Telegram received."""

    at: float  # time.time() on arrival
    chat_id: str
    text: str


class FakeTelegram:
    """The Bot API methods nanofleet calls: sendMessage is recorded, the rest answer ok."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: list[Sent] = []
        self.actions = 0
        self.fail_every = 0  # > 0: every n-th sendMessage answers 502 (a flaky platform)
        self._ids = itertools.count(1)
        self._calls = itertools.count(1)
        self.server = ThreadServer(Starlette(routes=[Route("/bot{token}/{method}", self._call, methods=["POST"])]))

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> FakeTelegram:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def reset(self) -> None:
        with self.lock:
            self.sent.clear()
            self.actions = 0

    def snapshot(self) -> list[Sent]:
        with self.lock:
            return list(self.sent)

    async def _call(self, request: Request) -> JSONResponse:
        method = request.path_params["method"]
        try:
            payload: dict[str, Any] = await request.json()
        except ClientDisconnect:  # the sending worker was killed mid-request: nothing was sent
            return JSONResponse({"ok": False}, status_code=499)
        if method != "sendMessage":
            with self.lock:
                self.actions += 1
            return JSONResponse({"ok": True, "result": True})
        if self.fail_every and next(self._calls) % self.fail_every == 0:
            return JSONResponse({"ok": False, "description": "Bad Gateway"}, status_code=502)
        with self.lock:
            self.sent.append(Sent(time.time(), str(payload.get("chat_id")), str(payload.get("text", ""))))
            message_id = next(self._ids)
        return JSONResponse({"ok": True, "result": {"message_id": message_id, "chat": {"id": payload.get("chat_id")},
                                                    "date": int(time.time()), "text": payload.get("text")}})


def telegram_update(update_id: int, chat_id: int, text: str) -> dict[str, Any]:
    """A private-chat text message as the Bot API posts it to a webhook."""
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": int(time.time()), "text": text,
        "chat": {"id": chat_id, "type": "private", "first_name": "bench"},
        "from": {"id": chat_id, "is_bot": False, "first_name": "bench"}}}
