"""A fake Slack Web API (chat.postMessage, and files sent by Slack's external upload:
files.getUploadURLExternal, the bytes POSTed to the upload URL it gives, files.completeUploadExternal;
methods with `Authorization: Bearer xoxb-...`) and Events API requests signed as Slack signs them (v0
HMAC-SHA256 over v0:timestamp:body)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.platform import Call, FakePlatform, Upload

BOT_USER = "UBOT0001"


@dataclass
class Slot:
    """A file the bot announced with files.getUploadURLExternal: its name and length, then its bytes
    once they reached the upload URL."""

    filename: str
    length: int
    data: bytes | None = None


class FakeSlack(FakePlatform):
    message_ops = ("chat.postMessage",)

    def __init__(self, bot_token: str, signing_secret: str) -> None:
        self.bot_token, self.signing_secret = bot_token, signing_secret
        self.seq = itertools.count(1)
        self.files: dict[str, bytes] = {}  # file id -> content, at its url_private_download
        self.downloads: list[str] = []
        self.slots: dict[str, Slot] = {}  # file id -> what the bot uploads under it
        self.shared: list[tuple[str, str]] = []  # (channel, file id) as files.completeUploadExternal shared them
        super().__init__()

    def reset(self) -> None:
        super().reset()
        with self.lock:
            self.slots.clear()
            self.shared.clear()

    def routes(self) -> list[Route]:
        return [Route("/chat.postMessage", self._post, methods=["POST"]),
                Route("/files.getUploadURLExternal", self._upload_url, methods=["POST"]),
                Route("/upload/v1/{file_id}", self._upload, methods=["POST"]),
                Route("/files.completeUploadExternal", self._complete, methods=["POST"]),
                Route("/files-pri/{team_file}/download/{name}", self._download, methods=["GET"])]

    def chat_of(self, call: Call) -> str:
        return str(call.body.get("channel"))

    def text_of(self, call: Call) -> str:
        return str(call.body.get("text"))

    def received_files(self, chat: str) -> list[tuple[str, bytes]]:
        """Files shared in `chat` by files.completeUploadExternal: the name they were announced under
        and the bytes that reached the upload URL."""
        with self.lock:
            return [(self.slots[f].filename, self.slots[f].data or b"") for c, f in self.shared if c == chat]

    async def _post(self, request: Request) -> Response:
        return await self.answer("chat.postMessage", request, self._handle)

    def _unauthorized(self, request: Request, method: str) -> tuple[int, Any] | None:
        """Slack's answer to a method called without the bot token, else None."""
        if request.headers.get("authorization") == f"Bearer {self.bot_token}":
            return None
        self.refuse(f"{method} without the bot token")
        return 200, {"ok": False, "error": "invalid_auth"}

    def _handle(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        if (refused := self._unauthorized(request, "chat.postMessage")) is not None:
            return refused
        text = body.get("text")
        if not isinstance(body.get("channel"), str) or not isinstance(text, str) or not text.strip():
            self.refuse("chat.postMessage without channel or text")
            return 200, {"ok": False, "error": "no_text"}
        if len(text) > 40_000:
            self.refuse("text over 40000 characters")
            return 200, {"ok": False, "error": "msg_too_long"}
        return 200, {"ok": True, "channel": body["channel"], "ts": f"{int(time.time())}.{next(self.seq):06d}"}

    # ------------------------------------------------------------------ files the bot sends

    async def _upload_url(self, request: Request) -> Response:
        return await self.answer("files.getUploadURLExternal", request, self._announce)

    async def _upload(self, request: Request) -> Response:
        return await self.answer("upload", request, self._receive)

    async def _complete(self, request: Request) -> Response:
        return await self.answer("files.completeUploadExternal", request, self._share)

    def _announce(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        """files.getUploadURLExternal takes form fields only (not JSON): a filename and a positive length.
        Answers a file id and an upload URL on this fake."""
        if (refused := self._unauthorized(request, "files.getUploadURLExternal")) is not None:
            return refused
        form = request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded")
        name, length = body.get("filename"), str(body.get("length", ""))
        if not (form and isinstance(name, str) and name and length.isdigit() and int(length) > 0):
            self.refuse(f"files.getUploadURLExternal without a form-encoded filename and length: {body}")
            return 200, {"ok": False, "error": "invalid_arguments"}
        with self.lock:
            file_id = f"F{next(self.seq):08d}"
            self.slots[file_id] = Slot(name, int(length))
        return 200, {"ok": True, "upload_url": f"{self.url}/upload/v1/{file_id}", "file_id": file_id}

    def _receive(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        """The upload URL: one multipart part `file` of the announced length, once (no token needed)."""
        slot = self.slots.get(request.path_params["file_id"])
        if slot is None or slot.data is not None:
            self.refuse("an upload to a URL not given, or given for a file already uploaded")
            return 404, b"Not Found"
        part = body.get("file")
        if not isinstance(part, Upload) or len(part.data) != slot.length:
            got = len(part.data) if isinstance(part, Upload) else None
            self.refuse(f"an upload of {got} bytes in part `file` for a file announced as {slot.length}")
            return 400, b"Bad Request"
        with self.lock:
            slot.data = part.data
        return 200, f"OK - {slot.length}".encode()

    def _share(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        """files.completeUploadExternal (JSON, or a form with `files` as a JSON string): files uploaded
        in full, shared in `channel_id` (in its thread with thread_ts); without one a file stays private."""
        if (refused := self._unauthorized(request, "files.completeUploadExternal")) is not None:
            return refused
        files = _json_list(body.get("files"))
        if not files or any(not isinstance(f, dict) or not isinstance(f.get("id"), str) for f in files):
            self.refuse(f"files.completeUploadExternal without a list of files with ids: {body}")
            return 200, {"ok": False, "error": "invalid_arguments"}
        ids = [f["id"] for f in files]
        if any(self.slots.get(i) is None or self.slots[i].data is None for i in ids):
            self.refuse(f"files.completeUploadExternal for files not uploaded: {ids}")
            return 200, {"ok": False, "error": "file_not_found"}
        channel = body.get("channel_id")
        if not (isinstance(channel, str) and channel):
            self.refuse("files.completeUploadExternal without channel_id: the files stay private")
        else:
            with self.lock:
                self.shared += [(channel, i) for i in ids]
        return 200, {"ok": True, "files": [{"id": f["id"], "title": f.get("title") or self.slots[f["id"]].filename}
                                           for f in files]}

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

    def rate_limit(self, retry_after: int = 1, times: int = 1, op: str = "chat.postMessage") -> None:
        """Slack's 429: HTTP 429, Retry-After in seconds, error `ratelimited`."""
        self.script(op, 429, {"ok": False, "error": "ratelimited"}, headers={"Retry-After": str(retry_after)},
                    times=times)

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


def _json_list(value: object) -> list[Any] | None:
    """A list as JSON sends it, or as a form sends it (a JSON string); else None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, list) else None
