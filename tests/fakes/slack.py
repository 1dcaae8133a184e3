"""A fake Slack Web API (chat.postMessage with `Authorization: Bearer xoxb-...`) and Events API
requests signed as Slack signs them (v0 HMAC-SHA256 over v0:timestamp:body)."""

from __future__ import annotations

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

BOT_USER = "UBOT0001"


class FakeSlack(FakePlatform):
    message_ops = ("chat.postMessage",)

    def __init__(self, bot_token: str, signing_secret: str) -> None:
        self.bot_token, self.signing_secret = bot_token, signing_secret
        self.seq = itertools.count(1)
        self.files: dict[str, bytes] = {}  # file id -> content, at its url_private_download
        self.downloads: list[str] = []
        super().__init__()

    def routes(self) -> list[Route]:
        return [Route("/chat.postMessage", self._post, methods=["POST"]),
                Route("/files-pri/{team_file}/download/{name}", self._download, methods=["GET"])]

    def chat_of(self, call: Call) -> str:
        return str(call.body.get("channel"))

    def text_of(self, call: Call) -> str:
        return str(call.body.get("text"))

    async def _post(self, request: Request) -> Response:
        return await self.answer("chat.postMessage", request, self._handle)

    def _handle(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        if request.headers.get("authorization") != f"Bearer {self.bot_token}":
            self.refuse("chat.postMessage without the bot token")
            return 200, {"ok": False, "error": "invalid_auth"}
        text = body.get("text")
        if not isinstance(body.get("channel"), str) or not isinstance(text, str) or not text.strip():
            self.refuse("chat.postMessage without channel or text")
            return 200, {"ok": False, "error": "no_text"}
        if len(text) > 40_000:
            self.refuse("text over 40000 characters")
            return 200, {"ok": False, "error": "msg_too_long"}
        return 200, {"ok": True, "channel": body["channel"], "ts": f"{int(time.time())}.{next(self.seq):06d}"}

    async def _download(self, request: Request) -> Response:
        def serve(body: dict[str, Any], request: Request) -> tuple[int, Any]:
            if request.headers.get("authorization") != f"Bearer {self.bot_token}":
                self.refuse("a file download without the bot token")
                return 200, b"<!DOCTYPE html><html>Slack: sign in</html>"  # what Slack serves then
            file_id = request.path_params["team_file"].removeprefix("T1-")
            if file_id not in self.files:
                return 404, b"file_not_found"
            self.downloads.append(file_id)
            return 200, self.files[file_id]
        return await self.answer("files", request, serve)

    def rate_limit(self, retry_after: int = 1, times: int = 1) -> None:
        self.script("chat.postMessage", 429, {"ok": False, "error": "ratelimited"},
                    headers={"Retry-After": str(retry_after)}, times=times)

    # ------------------------------------------------------------------ inbound

    def event(self, *, channel: str, user: str, text: str, event_id: str, kind: str = "app_mention",
              **extra: Any) -> dict[str, Any]:
        ts = f"{int(time.time())}.{next(self.seq):06d}"
        event = {"type": kind, "user": user, "text": text, "ts": ts, "channel": channel, "event_ts": ts, **extra}
        if kind == "message":
            event.setdefault("channel_type", "im")
        return {"token": "x", "team_id": "T1", "api_app_id": "A1", "type": "event_callback", "event_id": event_id,
                "event_time": int(time.time()), "event": event,
                "authorizations": [{"team_id": "T1", "user_id": BOT_USER, "is_bot": True}]}

    def file_share(self, *, channel: str, user: str, text: str, event_id: str, content: bytes, mimetype: str,
                   name: str, also: tuple[bytes, ...] = ()) -> dict[str, Any]:
        """A direct message with a file (and `also`, more of its type), downloads served with the bot token."""
        shared = []
        for n, data in enumerate((content, *also)):
            file_id = f"F{len(self.files) + 1:04d}"
            self.files[file_id] = data
            called = name if n == 0 else f"{n}-{name}"
            shared.append({"id": file_id, "name": called, "mimetype": mimetype, "size": len(data),
                           "url_private": f"{self.url}/files-pri/T1-{file_id}/{called}",
                           "url_private_download": f"{self.url}/files-pri/T1-{file_id}/download/{called}"})
        return self.event(channel=channel, user=user, text=text, event_id=event_id, kind="message",
                          subtype="file_share", files=shared)

    def signed(self, payload: dict[str, Any], *, timestamp: int | None = None,
               secret: str | None = None) -> tuple[bytes, dict[str, str]]:
        raw = json.dumps(payload).encode()
        ts = str(int(time.time()) if timestamp is None else timestamp)
        sig = "v0=" + hmac.new((secret or self.signing_secret).encode(), f"v0:{ts}:".encode() + raw,
                               hashlib.sha256).hexdigest()
        return raw, {"Content-Type": "application/json", "X-Slack-Request-Timestamp": ts, "X-Slack-Signature": sig}
