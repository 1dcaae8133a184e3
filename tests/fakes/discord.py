"""A fake Discord API: interaction webhooks (edit @original, follow-ups) that accept only tokens of
interactions it issued, bot channel messages behind `Authorization: Bot`, each as JSON or as a
multipart form with files (checked as Discord checks one), and interactions signed with Ed25519 as
Discord signs them."""

from __future__ import annotations

import itertools
import json
import re
import time
import uuid
from typing import Any

from nacl.signing import SigningKey
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.platform import Call, FakePlatform, Upload

UPLOAD_LIMIT = 10 * 1024 * 1024  # per file, for a bot in a server without boosts
FILE_PART = re.compile(r"files\[([0-9]+)\]")
INVALID_FORM = {"message": "Invalid Form Body", "code": 50035}


class FakeDiscord(FakePlatform):
    message_ops = ("edit_original", "followup", "channel_message")

    def __init__(self, application_id: str, bot_token: str) -> None:
        self.application_id, self.bot_token = application_id, bot_token
        self.key = SigningKey.generate()
        self.interactions: dict[str, str] = {}  # interaction token -> channel id
        self.seq = itertools.count(1)
        self.attachments: dict[str, bytes] = {}  # attachment id -> content, on the "CDN"
        self.downloads: list[str] = []
        self.commands: dict[str, dict[str, Any]] = {}  # global application commands, by name
        super().__init__()

    @property
    def public_key(self) -> str:
        return self.key.verify_key.encode().hex()

    def routes(self) -> list[Route]:
        return [Route("/webhooks/{app}/{token}/messages/@original", self._edit, methods=["PATCH"]),
                Route("/webhooks/{app}/{token}", self._followup, methods=["POST"]),
                Route("/channels/{channel}/messages", self._channel, methods=["POST"]),
                Route("/attachments/{channel}/{attachment}/{name}", self._attachment, methods=["GET"]),
                Route("/applications/{app}/commands", self._command, methods=["POST"])]

    def chat_of(self, call: Call) -> str:
        if call.op == "channel_message":
            return call.path.split("/")[2]
        return self.interactions.get(call.path.split("/")[3], "?")

    def text_of(self, call: Call) -> str:
        return str(message_of(call).get("content", ""))

    def received_files(self, chat: str) -> list[tuple[str, bytes]]:
        """Attachments of the messages users see in `chat`: each part `files[n]` under the filename its
        attachment `n` gives (else the part's own), in the order of the calls, then of n."""
        out = []
        for call in self.sent(chat):
            if not _multipart(call.headers):
                continue
            names = {str(a.get("id")): a.get("filename") for a in message_of(call).get("attachments") or []}
            for n, part in _parts(call.body):
                out.append((str(names.get(n) or part.filename), part.data))
        return out

    async def _edit(self, request: Request) -> Response:
        return await self.answer("edit_original", request, self._webhook)

    async def _followup(self, request: Request) -> Response:
        return await self.answer("followup", request, self._webhook)

    async def _channel(self, request: Request) -> Response:
        return await self.answer("channel_message", request, self._bot_message)

    async def _attachment(self, request: Request) -> Response:
        def serve(body: dict[str, Any], request: Request) -> tuple[int, Any]:
            found = self.attachments.get(request.path_params["attachment"])
            if found is None or "hm" not in request.query_params:  # the CDN's URLs are signed
                return 404, {"message": "404: Not Found"}
            self.downloads.append(request.path_params["attachment"])
            return 200, found
        return await self.answer("attachment", request, serve)

    async def _command(self, request: Request) -> Response:
        return await self.answer("command", request, self._upsert)

    def _upsert(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        """Create or update a global command (by name), checked as Discord checks one."""
        if request.headers.get("authorization") != f"Bot {self.bot_token}" \
                or request.path_params["app"] != self.application_id:
            self.refuse("a command for another application, or without the bot token")
            return 401, {"message": "401: Unauthorized", "code": 0}
        options = body.get("options") or []
        named = [body.get("name"), *(o.get("name") for o in options)]
        valid = all(isinstance(n, str) and re.fullmatch(r"[-_a-z0-9]{1,32}", n) for n in named) \
            and 1 <= len(str(body.get("description") or "")) <= 100 \
            and all(o.get("type") in range(1, 12) and 1 <= len(str(o.get("description") or "")) <= 100
                    for o in options) \
            and [o.get("required", False) for o in options] == sorted((o.get("required", False) for o in options),
                                                                     reverse=True)  # required ones first
        if not valid:
            self.refuse(f"an invalid command: {body}")
            return 400, {"message": "Invalid Form Body", "code": 50035}
        created = body["name"] not in self.commands
        self.commands[body["name"]] = {**body, "id": self.commands.get(body["name"], {}).get("id", str(next(self.seq)))}
        return (201 if created else 200), self.commands[body["name"]]

    def _webhook(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        app, token = request.path_params["app"], request.path_params["token"]
        if app != self.application_id or token not in self.interactions:
            self.refuse("interaction webhook with an unknown application id or token")
            return 401, {"message": "Invalid Webhook Token", "code": 50027}
        return self._message(body, request)

    def _bot_message(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        if request.headers.get("authorization") != f"Bot {self.bot_token}":
            self.refuse("channel message without the bot token")
            return 401, {"message": "401: Unauthorized", "code": 0}
        return self._message(body, request)

    def _message(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        return self._form(body) if _multipart(request.headers) else self._content(body)

    def _form(self, form: dict[str, Any]) -> tuple[int, Any]:
        """A message with files, as Discord checks one: `payload_json` is a JSON object, each of its
        attachments names a part `files[id]`, a part has a filename and is within the upload limit, and
        the message has content (up to 2000 characters) or a file."""
        try:
            message = json.loads(form.get("payload_json") or "{}")
        except (TypeError, ValueError):
            message = None
        if not isinstance(message, dict):
            self.refuse("payload_json that is no JSON object")
            return 400, {"message": "The request body contains invalid JSON.", "code": 50109}
        parts, attachments = dict(_parts(form)), message.get("attachments") or []
        stray = [k for k, v in form.items() if isinstance(v, Upload) and not FILE_PART.fullmatch(k)]
        if stray or not isinstance(attachments, list) or any(
                not isinstance(a, dict) or str(a.get("id")) not in parts for a in attachments):
            self.refuse(f"attachments {attachments} that name no part files[id] (parts: {sorted(form)})")
            return 400, INVALID_FORM
        if any(not p.filename for p in parts.values()):
            self.refuse("a file part without a filename")
            return 400, INVALID_FORM
        if any(len(p.data) > UPLOAD_LIMIT for p in parts.values()):
            self.refuse("a file over the upload limit")
            return 413, {"message": "Request entity too large", "code": 40005}
        content = message.get("content")
        if content is not None and (not isinstance(content, str) or len(content) > 2000):
            self.refuse("content that is no string of up to 2000 characters")
            return 400, INVALID_FORM
        if not parts and not (content or "").strip():
            self.refuse("a message with neither content nor files")
            return 400, {"message": "Cannot send an empty message", "code": 50006}
        return 200, {"id": str(next(self.seq)), "content": content or "",
                     "attachments": [{"id": str(next(self.seq)), "filename": p.filename, "size": len(p.data)}
                                     for p in parts.values()]}

    def _content(self, body: dict[str, Any]) -> tuple[int, Any]:
        content = body.get("content")
        if not isinstance(content, str) or not content.strip() or len(content) > 2000:
            self.refuse(f"content of {len(content) if isinstance(content, str) else 'no'} characters")
            return 400, {"message": "Invalid Form Body", "code": 50035}
        return 200, {"id": str(next(self.seq)), "content": content}

    def rate_limit(self, op: str = "edit_original", retry_after: float = 0.3, times: int = 1) -> None:
        self.script(op, 429, {"message": "You are being rate limited.", "retry_after": retry_after, "global": False},
                    headers={"Retry-After": str(retry_after)}, times=times)

    # ------------------------------------------------------------------ inbound

    def command(self, *, channel: str, user: str, text: str, interaction_id: str, attached: bytes | None = None,
                content_type: str = "image/png", filename: str = "photo.png") -> dict[str, Any]:
        """`/ask question: text` (no question when `text` is empty), with `file: ...` if `attached` is given
        (a photo unless `content_type` says otherwise)."""
        token = f"itk-{uuid.uuid4().hex}"
        self.interactions[token] = channel
        data: dict[str, Any] = {"id": "C1", "name": "ask", "type": 1,
                                "options": [{"name": "question", "type": 3, "value": text}] if text else []}
        if attached is not None:
            aid = str(next(self.seq))
            self.attachments[aid] = attached
            data["options"].append({"name": "file", "type": 11, "value": aid})
            url = f"{self.url}/attachments/{channel}/{aid}/{filename}?ex=1&is=1&hm=ab"
            data["resolved"] = {"attachments": {aid: {
                "id": aid, "filename": filename, "size": len(attached), "content_type": content_type, "url": url,
                "proxy_url": url}}}
        return {"id": interaction_id, "application_id": self.application_id, "type": 2, "token": token,
                "version": 1, "channel_id": channel, "guild_id": "G1",
                "member": {"user": {"id": user, "username": "ann"}, "roles": []}, "data": data}

    def signed(self, payload: dict[str, Any], *, timestamp: int | None = None,
               key: SigningKey | None = None) -> tuple[bytes, dict[str, str]]:
        raw = json.dumps(payload).encode()
        ts = str(int(time.time()) if timestamp is None else timestamp)
        sig = (key or self.key).sign(ts.encode() + raw).signature.hex()
        return raw, {"Content-Type": "application/json", "X-Signature-Ed25519": sig, "X-Signature-Timestamp": ts}


def message_of(call: Call) -> dict[str, Any]:
    """The message a call sent: its JSON body, or a multipart form's `payload_json`."""
    if not _multipart(call.headers):
        return call.body if isinstance(call.body, dict) else {}
    try:
        message = json.loads(call.body.get("payload_json") or "{}")
    except (TypeError, ValueError):
        return {}
    return message if isinstance(message, dict) else {}


def _multipart(headers: Any) -> bool:
    return str(headers.get("content-type", "")).startswith("multipart/form-data")


def _parts(form: dict[str, Any]) -> list[tuple[str, Upload]]:
    """The form's file parts `files[n]`, as (n, part), by n."""
    found = [(m.group(1), v) for k, v in form.items()
             if isinstance(v, Upload) and (m := FILE_PART.fullmatch(k))]
    return sorted(found, key=lambda item: int(item[0]))
