"""A fake Feishu / Lark Open API: tenant access tokens (issued, expiring, revocable), the IM message
API (text and posts, images and files uploaded first) and the bot's info (bot/v3/info, its open_id)
behind `Authorization: Bearer <tenant token>` (a repeated uuid is sent once, as Feishu does), and
events, with @-mentions, encrypted (AES-256-CBC) and signed as Feishu sends them."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import time
import uuid
from typing import Any

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.platform import Call, FakePlatform, Handler, Upload

MB = 1024 * 1024
UPLOAD_LIMITS = {"image": 10 * MB, "file": 30 * MB}
FILE_TYPES = ("opus", "mp4", "pdf", "doc", "xls", "ppt", "stream")
IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF8", b"RIFF", b"BM")  # formats Feishu reads


def encrypt(plain: bytes, key: str) -> str:
    iv = os.urandom(16)
    padder = padding.PKCS7(128).padder()
    data = padder.update(plain) + padder.finalize()
    enc = Cipher(algorithms.AES(hashlib.sha256(key.encode()).digest()), modes.CBC(iv)).encryptor()
    return base64.b64encode(iv + enc.update(data) + enc.finalize()).decode()


class FakeFeishu(FakePlatform):
    message_ops = ("im.message.create",)

    def __init__(self, app_id: str, app_secret: str, verification_token: str, encrypt_key: str,
                 bot_open_id: str = "ou_bot0001", bot_name: str = "nanofleet") -> None:
        self.app_id, self.app_secret = app_id, app_secret
        self.bot_open_id, self.bot_name = bot_open_id, bot_name
        self.verification_token, self.encrypt_key = verification_token, encrypt_key
        self.tokens: set[str] = set()
        self.by_uuid: dict[str, str] = {}
        self.resources: dict[tuple[str, str], tuple[bytes, str]] = {}  # (message id, key) -> content, type
        self.uploads: dict[str, tuple[str, str, bytes]] = {}  # image or file key -> kind, name, content
        self.seq = itertools.count(1)
        self.refuse_posts = False  # as Feishu would a post it cannot read
        super().__init__()

    def reset(self) -> None:
        super().reset()
        with self.lock:
            self.by_uuid.clear()
            self.uploads.clear()
            self.refuse_posts = False

    def routes(self) -> list[Route]:
        return [Route("/auth/v3/tenant_access_token/internal", self._token, methods=["POST"]),
                Route("/im/v1/messages", self._message, methods=["POST"]),
                Route("/im/v1/images", self._image, methods=["POST"]),
                Route("/im/v1/files", self._file, methods=["POST"]),
                Route("/bot/v3/info", self._bot_info, methods=["GET"]),
                Route("/im/v1/messages/{message_id}/resources/{key}", self._resource, methods=["GET"])]

    def chat_of(self, call: Call) -> str:
        return str(call.body.get("receive_id"))

    def text_of(self, call: Call) -> str:
        return _text(call.body.get("msg_type"), json.loads(call.body.get("content") or "{}")) or ""

    def received_files(self, chat: str) -> list[tuple[str, bytes]]:
        """Image and file messages users see: the name (a file's file_name, an image's part's
        filename) and bytes of what they name."""
        out = []
        for call in self.sent(chat):
            kind = call.body.get("msg_type")
            if kind in UPLOAD_LIMITS:
                _, name, data = self.uploads[json.loads(call.body["content"])[f"{kind}_key"]]
                out.append((name, data))
        return out

    def sent(self, chat: str | None = None) -> list[Call]:
        """Messages users see: a repeated uuid shows once."""
        seen: set[object] = set()
        out = []
        for call in super().sent(chat):
            key = call.body.get("uuid") or id(call)
            if key not in seen:
                seen.add(key)
                out.append(call)
        return out

    def revoke_tokens(self) -> None:
        with self.lock:
            self.tokens.clear()

    def token_calls(self) -> int:
        with self.lock:
            return sum(1 for c in self.calls if c.op == "tenant_access_token" and c.status == 200)

    def bot_info_calls(self) -> int:
        with self.lock:
            return sum(1 for c in self.calls if c.op == "bot.info")

    async def _token(self, request: Request) -> Response:
        return await self.answer("tenant_access_token", request, self._issue)

    def _issue(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        if body.get("app_id") != self.app_id or body.get("app_secret") != self.app_secret:
            self.refuse("tenant_access_token with wrong app credentials")
            return 400, {"code": 10014, "msg": "app secret invalid"}
        token = f"t-{uuid.uuid4().hex}"
        with self.lock:
            self.tokens.add(token)
        return 200, {"code": 0, "msg": "ok", "tenant_access_token": token, "expire": 7200}

    async def _bot_info(self, request: Request) -> Response:
        return await self.answer("bot.info", request, self._info)

    def _info(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        if request.headers.get("authorization", "").removeprefix("Bearer ") not in self.tokens:
            self.refuse("bot info with an invalid tenant access token")
            return 400, {"code": 99991663, "msg": "Invalid access token for authorization"}
        return 200, {"code": 0, "msg": "ok", "bot": {"activate_status": 2, "app_name": self.bot_name,
                                                     "avatar_url": "", "ip_white_list": [],
                                                     "open_id": self.bot_open_id}}

    async def _message(self, request: Request) -> Response:
        return await self.answer("im.message.create", request, self._create)

    def _create(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        if token not in self.tokens:
            self.refuse("im message with an invalid tenant access token")
            return 400, {"code": 99991663, "msg": "Invalid access token for authorization"}
        kind = body.get("msg_type")
        if request.query_params.get("receive_id_type") != "chat_id" or kind not in ("text", "post", "image", "file") \
                or (kind == "post" and self.refuse_posts):
            self.refuse(f"bad message request {body}")
            return 400, {"code": 230001, "msg": "invalid params"}
        content = json.loads(body.get("content") or "{}")
        if kind in UPLOAD_LIMITS:
            if self.uploads.get(content.get(f"{kind}_key"), ("",))[0] != kind:
                self.refuse(f"{kind} message naming no {kind} uploaded: {content}")
                return 400, {"code": 230001, "msg": f"invalid {kind}_key"}
        elif not isinstance(text := _text(kind, content), str) or not text.strip() \
                or len(body["content"].encode()) > 150_000:
            self.refuse("empty or oversized text content")
            return 400, {"code": 230025, "msg": "content too long or empty"}
        with self.lock:
            mid = self.by_uuid.setdefault(body.get("uuid") or uuid.uuid4().hex, f"om_{next(self.seq)}")
        return 200, {"code": 0, "msg": "success", "data": {"message_id": mid, "chat_id": body["receive_id"]}}

    async def _image(self, request: Request) -> Response:
        return await self.answer("im.image.create", request, self._uploader("image"))

    async def _file(self, request: Request) -> Response:
        return await self.answer("im.file.create", request, self._uploader("file"))

    def _uploader(self, kind: str) -> Handler:
        """im/v1/images or im/v1/files: a multipart form with its type and the `kind` part, not empty and
        under the cap (an image in a format Feishu reads); answers the key it is sent by."""
        def upload(body: dict[str, Any], request: Request) -> tuple[int, Any]:
            if request.headers.get("authorization", "").removeprefix("Bearer ") not in self.tokens:
                self.refuse(f"{kind} upload with an invalid tenant access token")
                return 400, {"code": 99991663, "msg": "Invalid access token for authorization"}
            part, name = body.get(kind), body.get("file_name")
            typed = body.get("image_type") == "message" if kind == "image" else \
                body.get("file_type") in FILE_TYPES and isinstance(name, str) and bool(name)
            if not (typed and isinstance(part, Upload)):
                self.refuse(f"bad {kind} upload {sorted(body)}")
                return 400, {"code": 234001, "msg": "Invalid request param."}
            if not 0 < len(part.data) <= UPLOAD_LIMITS[kind] \
                    or (kind == "image" and not part.data.startswith(IMAGE_MAGIC)):
                self.refuse(f"{kind} upload of {len(part.data)} bytes, empty, too large or no image")
                return 400, {"code": 234006, "msg": "The file size exceed the max value or is not valid."}
            key = f"{'img' if kind == 'image' else 'file'}_v3_up{next(self.seq)}"
            with self.lock:
                self.uploads[key] = (kind, name if isinstance(name, str) else part.filename, part.data)
            return 200, {"code": 0, "msg": "success", "data": {f"{kind}_key": key}}
        return upload

    async def _resource(self, request: Request) -> Response:
        def serve(body: dict[str, Any], request: Request) -> tuple[int, Any]:
            if request.headers.get("authorization", "").removeprefix("Bearer ") not in self.tokens:
                self.refuse("a message resource with an invalid tenant access token")
                return 400, {"code": 99991663, "msg": "Invalid access token for authorization"}
            found = self.resources.get((request.path_params["message_id"], request.path_params["key"]))
            if found is None or request.query_params.get("type") != found[1]:
                return 400, {"code": 234003, "msg": "File not in msg."}
            return 200, found[0]
        return await self.answer("im.message.resource", request, serve)

    def rate_limit(self, times: int = 1) -> None:
        self.script("im.message.create", 429, {"code": 99991400, "msg": "request trigger frequency limit"},
                    headers={"x-ogw-ratelimit-reset": "1"}, times=times)

    # ------------------------------------------------------------------ inbound

    def event(self, *, chat: str, sender: str, text: str, event_id: str, chat_type: str = "p2p",
              mentions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """A message event; `text` writes a mention as its placeholder (`@_user_1`), `mentions` says whom."""
        message: dict[str, Any] = {
            "message_id": f"om_in{next(self.seq)}", "chat_id": chat, "chat_type": chat_type, "message_type": "text",
            "content": json.dumps({"text": text}), "create_time": "1700000000000"}
        if mentions:
            message["mentions"] = mentions
        return {"schema": "2.0",
                "header": {"event_id": event_id, "event_type": "im.message.receive_v1", "create_time": "1700000000000",
                           "token": self.verification_token, "app_id": self.app_id, "tenant_key": "tk"},
                "event": {"sender": {"sender_id": {"open_id": sender, "user_id": "u1", "union_id": "on_1"},
                                     "sender_type": "user", "tenant_key": "tk"},
                          "message": message}}

    def image(self, *, chat: str, sender: str, event_id: str, image: bytes) -> dict[str, Any]:
        """A private chat's image message, its image served as the message's resource."""
        event = self.event(chat=chat, sender=sender, text="", event_id=event_id)
        message, key = event["event"]["message"], f"img_v2_{next(self.seq)}"
        message.update(message_type="image", content=json.dumps({"image_key": key}))
        self.resources[(message["message_id"], key)] = (image, "image")
        return event

    def file(self, *, chat: str, sender: str, event_id: str, content: bytes, name: str) -> dict[str, Any]:
        """A private chat's file message, the file served as the message's resource."""
        event = self.event(chat=chat, sender=sender, text="", event_id=event_id)
        message, key = event["event"]["message"], f"file_v3_{next(self.seq)}"
        message.update(message_type="file", content=json.dumps({"file_key": key, "file_name": name}))
        self.resources[(message["message_id"], key)] = (content, "file")
        return event

    def post(self, *, chat: str, sender: str, event_id: str, title: str = "",
             paragraphs: list[list[dict[str, Any]]], images: tuple[bytes, ...] = (), chat_type: str = "p2p",
             mentions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """A rich-text message as Feishu sends it ({"title", "content": paragraphs}), each image a paragraph
        of its own after them, served as the message's resource."""
        event = self.event(chat=chat, sender=sender, text="", event_id=event_id, chat_type=chat_type,
                           mentions=mentions)
        message, content = event["event"]["message"], [list(p) for p in paragraphs]
        for image in images:
            key = f"img_v3_{next(self.seq)}"
            self.resources[(message["message_id"], key)] = (image, "image")
            content.append([{"tag": "img", "image_key": key, "width": 3, "height": 2}])
        message.update(message_type="post", content=json.dumps({"title": title, "content": content}))
        return event

    def mention(self, n: int, *, open_id: str | None = None, name: str | None = None) -> dict[str, Any]:
        """The `n`th mention of a message (`@_user_n` in its text): the bot unless `open_id` says whom."""
        who = open_id or self.bot_open_id
        return {"key": f"@_user_{n}", "id": {"open_id": who, "union_id": f"on_{who}", "user_id": f"u_{who}"},
                "name": name or (self.bot_name if who == self.bot_open_id else who), "tenant_key": "tk"}

    def signed(self, payload: dict[str, Any], *, timestamp: int | None = None, key: str | None = None,
               signed: bool = True) -> tuple[bytes, dict[str, str]]:
        """Encrypted with the encrypt key and signed, as Feishu sends events when encryption is on."""
        key = self.encrypt_key if key is None else key
        raw = json.dumps({"encrypt": encrypt(json.dumps(payload).encode(), key)}).encode()
        headers = {"Content-Type": "application/json"}
        if signed:
            ts, nonce = str(int(time.time()) if timestamp is None else timestamp), uuid.uuid4().hex
            sig = hashlib.sha256((ts + nonce + key).encode() + raw).hexdigest()
            headers.update({"X-Lark-Request-Timestamp": ts, "X-Lark-Request-Nonce": nonce, "X-Lark-Signature": sig})
        return raw, headers


def _text(kind: object, content: dict[str, Any]) -> str | None:
    """The text of a message we send: a text message's, or a post's, of the one markdown element it
    holds (a post's paragraphs hold elements; `md` takes a paragraph of its own)."""
    if kind == "text":
        text = content.get("text")
        return text if isinstance(text, str) else None
    paragraphs = (content.get("zh_cn") or {}).get("content")
    if not (isinstance(paragraphs, list) and len(paragraphs) == 1 and isinstance(paragraphs[0], list)
            and len(paragraphs[0]) == 1 and isinstance(paragraphs[0][0], dict) and paragraphs[0][0].get("tag") == "md"):
        return None
    text = paragraphs[0][0].get("text")
    return text if isinstance(text, str) else None
