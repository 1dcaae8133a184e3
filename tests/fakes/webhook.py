"""A fake receiver for the generic webhook channel: checks nanofleet's signature on each reply,
records it (with its Idempotency-Key), and signs inbound messages the way an integration must."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.platform import Call, FakePlatform


def sign(secret: str, timestamp: str, raw: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + raw, hashlib.sha256).hexdigest()


class FakeWebhookReceiver(FakePlatform):
    message_ops = ("callback",)

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.seq = itertools.count(1)
        super().__init__()

    @property
    def callback_url(self) -> str:
        return self.url + "/callback"

    def routes(self) -> list[Route]:
        return [Route("/callback", self._callback, methods=["POST"])]

    def chat_of(self, call: Call) -> str:
        return str(call.body.get("chat_id"))

    def text_of(self, call: Call) -> str:
        return str(call.body.get("text"))

    def received_files(self, chat: str) -> list[tuple[str, bytes]]:
        return [(c.body["file"]["name"], base64.b64decode(c.body["file"]["data"]))
                for c in self.sent(chat) if isinstance(c.body.get("file"), dict)]

    async def _callback(self, request: Request) -> Response:
        raw = await request.body()
        ts = request.headers.get("x-nanofleet-timestamp", "")
        good = hmac.compare_digest(request.headers.get("x-nanofleet-signature", ""), sign(self.secret, ts, raw))
        return await self.answer("callback", request, lambda body, r: self._handle(body, r, good))

    def _handle(self, body: dict[str, Any], request: Request, good: bool) -> tuple[int, Any]:
        if not good or not request.headers.get("idempotency-key"):
            self.refuse("callback without a valid signature or Idempotency-Key")
            return 401, {"error": "bad signature"}
        if not isinstance(body.get("text"), str) or not body.get("chat_id"):
            self.refuse("callback without chat_id or text")
            return 400, {"error": "bad payload"}
        return 200, {"id": f"r{next(self.seq)}"}

    def rate_limit(self, times: int = 1) -> None:
        self.script("callback", 429, {"error": "slow down"}, headers={"Retry-After": "1"}, times=times)

    # ------------------------------------------------------------------ inbound

    def message(self, *, chat: str, sender: str, text: str, event_id: str) -> dict[str, Any]:
        return {"id": event_id, "chat_id": chat, "sender_id": sender, "text": text, "meta": {"ticket": 7}}

    def signed(self, payload: dict[str, Any], *, timestamp: int | None = None,
               secret: str | None = None) -> tuple[bytes, dict[str, str]]:
        raw = json.dumps(payload).encode()
        ts = str(int(time.time()) if timestamp is None else timestamp)
        return raw, {"Content-Type": "application/json", "X-Nanofleet-Timestamp": ts,
                     "X-Nanofleet-Signature": sign(secret or self.secret, ts, raw)}
