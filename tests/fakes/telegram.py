"""A fake Telegram Bot API: the bot token in the URL path, getMe, sendMessage (HTML parse mode
checked: only Telegram's tags, properly nested, at most 4096 UTF-16 code units of text, as Telegram
counts), sendPhoto and sendDocument (multipart uploads), sendChatAction, setWebhook; and signed
webhook updates as Telegram sends them."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.platform import Call, FakePlatform, Upload

MAX_PHOTO, MAX_DOCUMENT = 10 * 1024 * 1024, 50 * 1024 * 1024  # what a bot may upload
MAX_TEXT = 4096  # UTF-16 code units of the text after entity parsing
TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "a", "code", "pre", "tg-spoiler",
        "span", "blockquote"}


class _Entities(HTMLParser):
    """Telegram's HTML parse mode: known tags, properly nested; collects the visible text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.text: list[str] = []
        self.error: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in TAGS:
            self.error = f"unsupported start tag \"{tag}\""
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.error = f"unmatched end tag \"{tag}\""

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse_entities(text: str) -> tuple[str, str | None]:
    """(visible text, error) as Telegram would see an HTML message."""
    if "<" in (bare := re.sub(r"</?[a-z-]+(\s[^<>]*)?>", "", text)) or ">" in bare:
        return text, "a < or > that is not part of a tag must be escaped"
    if re.search(r"&(?!(?:lt|gt|amp|quot|#\d+|#x[0-9a-fA-F]+);)", text):
        return text, "a & that does not start an entity must be escaped"
    parser = _Entities()
    parser.feed(text)
    parser.close()
    error = parser.error or (f"unclosed tags {parser.stack}" if parser.stack else None)
    return "".join(parser.text), error


class FakeTelegram(FakePlatform):
    message_ops = ("sendMessage",)

    def __init__(self, token: str, secret: str, username: str = "nanofleet_bot") -> None:
        self.token, self.secret, self.username = token, secret, username
        self.ids = itertools.count(1)
        self.update_ids = itertools.count(10_000)
        self.webhook: dict[str, Any] = {}
        self.commands: list[dict[str, Any]] = []
        self.files: dict[str, bytes] = {}  # file_id -> content, for getFile and /file/bot<token>/<path>
        self.downloads: list[str] = []  # the file_ids downloaded
        self.slow_once: dict[str, float] = {}  # file_id -> seconds its next download waits before it is served
        super().__init__()

    def routes(self) -> list[Route]:
        return [Route("/bot{token}/{method}", self._method, methods=["GET", "POST"]),
                Route("/file/bot{token}/{path:path}", self._file, methods=["GET"])]

    def chat_of(self, call: Call) -> str:
        return str(call.body.get("chat_id"))

    def text_of(self, call: Call) -> str:
        return str(call.body.get("text"))

    async def _method(self, request: Request) -> Response:
        method = request.path_params["method"]
        if request.path_params["token"] != self.token:
            self.refuse(f"wrong bot token in the path for {method}")
            return await self.answer(method, request, lambda b, r: (401, _error(401, "Unauthorized")))
        handler = {"getMe": self._get_me, "sendMessage": self._send, "sendChatAction": self._action,
                   "sendPhoto": self._upload("photo"), "sendDocument": self._upload("document"),
                   "setWebhook": self._set_webhook, "setMyCommands": self._set_commands, "getFile": self._get_file}
        if method not in handler:
            return await self.answer(method, request, lambda b, r: (404, _error(404, "Not Found")))
        return await self.answer(method, request, handler[method])

    def _send(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        text = body.get("text")
        if not isinstance(text, str) or "chat_id" not in body:
            self.refuse("sendMessage without chat_id or text")
            return 400, _error(400, "Bad Request: message text is empty")
        visible, error = parse_entities(text) if body.get("parse_mode") == "HTML" else (text, None)
        if error:
            self.refuse(f"can't parse entities: {error}")
            return 400, _error(400, f"Bad Request: can't parse entities: {error}")
        units = len(visible.encode("utf-16-le")) // 2
        if not visible.strip() or units > MAX_TEXT:
            self.refuse(f"message text of {units} UTF-16 code units")
            return 400, _error(400, "Bad Request: message is too long" if visible.strip() else "text is empty")
        return 200, {"ok": True, "result": {"message_id": next(self.ids), "chat": {"id": body["chat_id"]},
                                            "text": visible}}

    def _upload(self, field: str) -> Callable[[dict[str, Any], Request], tuple[int, Any]]:
        """sendPhoto or sendDocument, as a multipart form with the file in `field`, within the Bot API's
        upload limits (photos 10 MB, other files 50 MB)."""
        def handle(body: dict[str, Any], request: Request) -> tuple[int, Any]:
            file, limit = body.get(field), MAX_PHOTO if field == "photo" else MAX_DOCUMENT
            if not isinstance(file, Upload) or "chat_id" not in body:
                self.refuse(f"send {field} without chat_id or a file part named {field}")
                return 400, _error(400, f"Bad Request: there is no {field} in the request")
            if len(file.data) > limit:
                self.refuse(f"{field} of {len(file.data)} bytes")
                return 413, _error(413, "Request Entity Too Large")
            try:
                json.loads(body.get("reply_parameters") or "{}")
            except ValueError:
                self.refuse("reply_parameters that are not JSON")
                return 400, _error(400, "Bad Request: can't parse reply parameters JSON object")
            return 200, {"ok": True, "result": {"message_id": next(self.ids), "chat": {"id": body["chat_id"]},
                                                field: {"file_id": f"sent{next(self.ids)}"}}}
        return handle

    def received_files(self, chat: str) -> list[tuple[str, bytes]]:
        with self.lock:
            return [(c.body[f].filename, c.body[f].data) for c in self.calls
                    for f in ("photo", "document") if c.op == f"send{f.title()}" and c.status == 200
                    and str(c.body.get("chat_id")) == chat]

    def _get_me(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        bot_id = self.token.split(":", 1)[0]  # a bot token starts with the bot's id
        return 200, {"ok": True, "result": {"id": int(bot_id) if bot_id.isdigit() else 1, "is_bot": True,
                                            "first_name": "Nanofleet", "username": self.username,
                                            "can_join_groups": True, "can_read_all_group_messages": False,
                                            "supports_inline_queries": False}}

    def _action(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        return 200, {"ok": True, "result": True}

    def _get_file(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        file_id = body.get("file_id")
        if file_id not in self.files:
            return 400, _error(400, "Bad Request: invalid file_id")
        return 200, {"ok": True, "result": {"file_id": file_id, "file_unique_id": f"u{file_id}",
                                            "file_size": len(self.files[file_id]), "file_path": _path(file_id)}}

    async def _file(self, request: Request) -> Response:
        slow = self.slow_once.pop({_path(f): f for f in self.files}.get(request.path_params["path"], ""), 0.0)
        await asyncio.sleep(slow)

        def serve(body: dict[str, Any], request: Request) -> tuple[int, Any]:
            paths = {_path(file_id): file_id for file_id in self.files}
            name = paths.get(request.path_params["path"])
            if request.path_params["token"] != self.token or name is None:
                return 404, _error(404, "Not Found")
            self.downloads.append(name)
            return 200, self.files[name]
        return await self.answer("file", request, serve)

    def _set_webhook(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        self.webhook = body
        return 200, {"ok": True, "result": True, "description": "Webhook was set"}

    def _set_commands(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        """As the Bot API checks them: 1-32 characters of a-z, 0-9 and _, a description of 1-256."""
        commands = body.get("commands")
        if not isinstance(commands, list) or len(commands) > 100 or not all(
                isinstance(c, dict) and re.fullmatch(r"[a-z0-9_]{1,32}", str(c.get("command")))
                and isinstance(c.get("description"), str) and 1 <= len(c["description"]) <= 256 for c in commands):
            self.refuse(f"setMyCommands with bad commands: {commands}")
            return 400, _error(400, "Bad Request: BOT_COMMAND_INVALID")
        self.commands = commands
        return 200, {"ok": True, "result": True}

    def rate_limit(self, retry_after: int = 1, times: int = 1) -> None:
        self.script("sendMessage", 429, {**_error(429, f"Too Many Requests: retry after {retry_after}"),
                                         "parameters": {"retry_after": retry_after}}, times=times)

    # ------------------------------------------------------------------ inbound

    def update(self, *, chat: int, sender: int, text: str, update_id: int | None = None,
               chat_type: str = "private", **message: Any) -> dict[str, Any]:
        return {"update_id": update_id if update_id is not None else next(self.update_ids),
                "message": {"message_id": next(self.ids), "date": 1700000000, "text": text,
                            "chat": {"id": chat, "type": chat_type},
                            "from": {"id": sender, "is_bot": False, "first_name": "Ann", "username": f"u{sender}"},
                            **message}}

    def voice(self, *, chat: int, sender: int, audio: bytes) -> dict[str, Any]:
        """An update with a voice message (no text), its audio served by getFile and /file/."""
        file_id = f"voice{len(self.files) + 1}"
        self.files[file_id] = audio
        update = self.update(chat=chat, sender=sender, text="",
                             voice={"file_id": file_id, "file_unique_id": f"u{file_id}", "duration": 2,
                                    "mime_type": "audio/ogg", "file_size": len(audio)})
        del update["message"]["text"]
        return update

    def document(self, *, chat: int, sender: int, content: bytes, name: str, mime: str,
                 caption: str | None = None) -> dict[str, Any]:
        """An update with a file (and its caption), served by getFile and /file/."""
        file_id = f"doc{len(self.files) + 1}"
        self.files[file_id] = content
        update = self.update(chat=chat, sender=sender, text="", document={
            "file_id": file_id, "file_unique_id": f"u{file_id}", "file_name": name, "mime_type": mime,
            "file_size": len(content)}, **({"caption": caption} if caption is not None else {}))
        del update["message"]["text"]
        return update

    def photo(self, *, chat: int, sender: int, image: bytes, caption: str | None = None,
              chat_type: str = "private", album: str | None = None) -> dict[str, Any]:
        """An update with a photo in two sizes, as Telegram sends one (a thumbnail and the photo), the
        caption as its text; both served by getFile and /file/. An album's items share its media group id."""
        sizes = []
        for size, content in (("s", image[:64]), ("x", image)):
            file_id = f"photo{len(self.files) + 1}{size}"
            self.files[file_id] = content
            sizes.append({"file_id": file_id, "file_unique_id": f"u{file_id}", "file_size": len(content),
                          "width": 90 if size == "s" else 1280, "height": 60 if size == "s" else 853})
        update = self.update(chat=chat, sender=sender, text="", chat_type=chat_type, photo=sizes)
        del update["message"]["text"]
        if caption is not None:
            update["message"]["caption"] = caption
        if album is not None:
            update["message"]["media_group_id"] = album
        return update

    def signed(self, payload: dict[str, Any], secret: str | None = None) -> tuple[bytes, dict[str, str]]:
        return json.dumps(payload).encode(), {"Content-Type": "application/json",
                                              "X-Telegram-Bot-Api-Secret-Token": secret or self.secret}


def _path(file_id: str) -> str:
    """Where Telegram keeps a file, as getFile names it."""
    return f"photos/{file_id}.jpg" if file_id.startswith("photo") else f"voice/{file_id}.oga"


def _error(code: int, description: str) -> dict[str, Any]:
    return {"ok": False, "error_code": code, "description": description}
