"""A fake Feishu / Lark Open API: tenant access tokens (issued, expiring, revocable), the IM message
API and the bot's info (bot/v3/info, its open_id) behind `Authorization: Bearer <tenant token>` (a
repeated uuid is sent once, as Feishu does), and events, with @-mentions, encrypted (AES-256-CBC) and
signed as Feishu sends them."""

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

from tests.fakes.platform import Call, FakePlatform


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
        self.seq = itertools.count(1)
        self.refuse_posts = False  # as Feishu would a post it cannot read
        super().__init__()

    def reset(self) -> None:
        super().reset()
        with self.lock:
            self.by_uuid.clear()
            self.refuse_posts = False

    def routes(self) -> list[Route]:
        return [Route("/auth/v3/tenant_access_token/internal", self._token, methods=["POST"]),
                Route("/im/v1/messages", self._message, methods=["POST"]),
                Route("/bot/v3/info", self._bot_info, methods=["GET"]),
                Route("/im/v1/messages/{message_id}/resources/{key}", self._resource, methods=["GET"])]

    def chat_of(self, call: Call) -> str:
        return str(call.body.get("receive_id"))

    def text_of(self, call: Call) -> str:
        return _text(call.body.get("msg_type"), json.loads(call.body.get("content") or "{}")) or ""

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
        if request.query_params.get("receive_id_type") != "chat_id" or kind not in ("text", "post") \
                or (kind == "post" and self.refuse_posts):
            self.refuse(f"bad message request {body}")
            return 400, {"code": 230001, "msg": "invalid params"}
        text = _text(kind, json.loads(body.get("content") or "{}"))
        if not isinstance(text, str) or not text.strip() or len(body["content"].encode()) > 150_000:
            self.refuse("empty or oversized text content")
            return 400, {"code": 230025, "msg": "content too long or empty"}
        with self.lock:
            mid = self.by_uuid.setdefault(body.get("uuid") or uuid.uuid4().hex, f"om_{next(self.seq)}")
        return 200, {"code": 0, "msg": "success", "data": {"message_id": mid, "chat_id": body["receive_id"]}}

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
