"""A fake WhatsApp Cloud API (Graph API /{phone_number_id}/messages and /media uploads with
`Authorization: Bearer`) and webhooks signed as Meta signs them (X-Hub-Signature-256, HMAC of the raw
body)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.platform import Call, FakePlatform, Upload

# What /media takes (the list its refusal names) and Meta's limits: 5 MB for a photo, 100 MB for anything.
IMAGE_TYPES = ("image/jpeg", "image/png")
DOCUMENT_TYPES = (
    "text/plain", "application/pdf", "application/msword", "application/vnd.ms-excel", "application/vnd.ms-powerpoint",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation")
UPLOAD_TYPES = (*IMAGE_TYPES, *DOCUMENT_TYPES, "image/webp", "audio/aac", "audio/mp4", "audio/mpeg", "audio/amr",
                "audio/ogg", "audio/opus", "video/mp4", "video/3gpp")
MAX_IMAGE, MAX_MEDIA = 5 * 1024 * 1024, 100 * 1024 * 1024


class FakeWhatsApp(FakePlatform):
    message_ops = ("messages",)

    def __init__(self, access_token: str, app_secret: str, phone_number_id: str) -> None:
        self.access_token, self.app_secret, self.phone_number_id = access_token, app_secret, phone_number_id
        self.sent_ids = 0
        self.media: dict[str, bytes] = {}  # media id -> content, for GET /{media id} and its download URL
        self.mime: dict[str, str] = {}  # media id -> its type, where not a voice note's
        self.uploaded: dict[str, str] = {}  # media id -> the file name, for what the bot uploaded to /media
        super().__init__()

    def routes(self) -> list[Route]:
        return [Route("/{number}/messages", self._post, methods=["POST"]),
                Route("/{number}/media", self._post_media, methods=["POST"]),
                Route("/download/{media_id}", self._download, methods=["GET"]),
                Route("/{media_id}", self._media_url, methods=["GET"])]

    def chat_of(self, call: Call) -> str:
        return str(call.body.get("to"))

    def text_of(self, call: Call) -> str:
        return str((call.body.get("text") or {}).get("body"))

    def texts(self, chat: str) -> list[str]:
        return [self.text_of(c) for c in self.sent(chat) if c.body.get("type") == "text"]

    def received_files(self, chat: str) -> list[tuple[str, bytes]]:
        """Photos and documents that reached `chat`, with the name the user sees: a document's `filename`
        ("" without one), a photo's the name it was uploaded under."""
        out = []
        for call in self.sent(chat):
            kind, part = call.body.get("type"), call.body.get(str(call.body.get("type")))
            if kind in ("image", "document"):
                name = part.get("filename", "") if kind == "document" else self.uploaded[part["id"]]
                out.append((name, self.media[part["id"]]))
        return out

    async def _post(self, request: Request) -> Response:
        """POST /messages: a message, or (status "read") a read receipt with a typing indicator."""
        try:
            receipt = json.loads(await request.body()).get("status") == "read"
        except (ValueError, AttributeError):
            receipt = False
        if receipt:
            return await self.answer("typing", request, self._typing)
        return await self.answer("messages", request, self._handle)

    def _typing(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        """Marks a received message read and shows "typing..." (25 s, or until the reply)."""
        if (refused := self._unauthorized(request, "a read receipt")) is not None:
            return refused
        if body.get("messaging_product") != "whatsapp" or not str(body.get("message_id", "")).startswith("wamid.") \
                or body.get("typing_indicator") != {"type": "text"}:
            self.refuse(f"bad read receipt {body}")
            return 400, _error(100, "Invalid parameter")
        return 200, {"success": True}

    async def _post_media(self, request: Request) -> Response:
        return await self.answer("upload", request, self._upload)

    def _unauthorized(self, request: Request, what: str) -> tuple[int, Any] | None:
        """The answer to a call without the access token or for another phone number, else None."""
        if request.headers.get("authorization") != f"Bearer {self.access_token}":
            self.refuse(f"{what} without the access token")
            return 401, _error(190, "Invalid OAuth access token")
        if request.path_params["number"] != self.phone_number_id:
            self.refuse(f"{what} for an unknown phone number id")
            return 400, _error(100, "Unsupported post request")
        return None

    def _handle(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        if (refused := self._unauthorized(request, "messages")) is not None:
            return refused
        kind = body.get("type")
        if body.get("messaging_product") != "whatsapp" or kind not in ("text", "image", "document"):
            self.refuse(f"bad message payload {body}")
            return 400, _error(100, "Invalid parameter")
        problem = self._text_problem(body) if kind == "text" else self._media_problem(kind, body.get(kind))
        if problem is not None:
            self.refuse(problem[1]["error"]["message"])
            return problem
        wamid = self.next_wamid()
        self.sent_ids += 1
        return 200, {"messaging_product": "whatsapp", "contacts": [{"input": body["to"], "wa_id": body["to"]}],
                     "messages": [{"id": wamid}]}

    def _text_problem(self, body: dict[str, Any]) -> tuple[int, Any] | None:
        text = (body.get("text") or {}).get("body")
        if not isinstance(text, str):
            return 400, _error(100, f"Invalid parameter: bad text message {body}")
        if not text.strip() or len(text) > 4096:
            return 400, _error(100, "Param text['body'] must be at most 4096 characters long")
        return None

    def _media_problem(self, kind: str, part: object) -> tuple[int, Any] | None:
        """A photo or document must name media the bot uploaded; a photo, a JPEG or PNG within 5 MB."""
        media_id = part.get("id") if isinstance(part, dict) else None
        if media_id not in self.uploaded:
            return 400, _error(100, f"Invalid parameter: {kind} names no uploaded media ({part})")
        if kind == "image" and (self.mime[media_id] not in IMAGE_TYPES or len(self.media[media_id]) > MAX_IMAGE):
            return 400, _error(131053, f"Media upload error: an image must be a JPEG or PNG of at most {MAX_IMAGE}"
                                       f" bytes, not {self.mime[media_id]} of {len(self.media[media_id])}")
        return None

    def _upload(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        """POST /{number}/media (multipart: messaging_product, type, file): {"id": media id}. Meta judges
        the file part's own type."""
        if (refused := self._unauthorized(request, "a media upload")) is not None:
            return refused
        file = body.get("file")
        if body.get("messaging_product") != "whatsapp" or not body.get("type") or not isinstance(file, Upload):
            self.refuse(f"bad media upload {sorted(body)}")
            return 400, _error(100, "The parameters messaging_product, type and file are required")
        if file.content_type not in UPLOAD_TYPES:
            self.refuse(f"a media upload of type {file.content_type!r}")
            return 400, _error(100, f"Param file must be a file with one of the following types: "
                                    f"{', '.join(UPLOAD_TYPES)}. Received file of type '{file.content_type}'.")
        if len(file.data) > MAX_MEDIA:
            self.refuse(f"a media upload of {len(file.data)} bytes")
            return 400, _error(100, "Invalid parameter: File Too Large")
        with self.lock:
            media_id = f"media{len(self.media) + 1}"
            self.media[media_id], self.mime[media_id] = file.data, file.content_type
            self.uploaded[media_id] = file.filename
        return 200, {"id": media_id}

    def uploads(self) -> int:
        """Files uploaded to /media and accepted."""
        with self.lock:
            return sum(1 for c in self.calls if c.op == "upload" and c.status == 200)

    async def _media_url(self, request: Request) -> Response:
        def found(body: dict[str, Any], request: Request) -> tuple[int, Any]:
            media_id = request.path_params["media_id"]
            if request.headers.get("authorization") != f"Bearer {self.access_token}":
                return 401, _error(190, "Invalid OAuth access token")
            if media_id not in self.media:
                return 404, _error(100, "Unsupported get request")
            return 200, {"messaging_product": "whatsapp", "url": f"{self.url}/download/{media_id}",
                         "mime_type": self.mime.get(media_id, "audio/ogg; codecs=opus"),
                         "file_size": len(self.media[media_id]), "id": media_id}
        return await self.answer("media", request, found)

    async def _download(self, request: Request) -> Response:
        def serve(body: dict[str, Any], request: Request) -> tuple[int, Any]:
            if request.headers.get("authorization") != f"Bearer {self.access_token}":
                self.refuse("a media download without the access token")
                return 401, _error(190, "Invalid OAuth access token")
            return (200, self.media[request.path_params["media_id"]]) if request.path_params[
                "media_id"] in self.media else (404, _error(100, "Not found"))
        return await self.answer("download", request, serve)

    def next_wamid(self) -> str:
        """The id the next accepted message will get."""
        return f"wamid.out{self.sent_ids + 1}"

    def rate_limit(self, times: int = 1) -> None:
        self.script("messages", 429, _error(130429, "Rate limit hit"), times=times)

    # ------------------------------------------------------------------ inbound

    def event(self, *, sender: str, text: str, wamid: str) -> dict[str, Any]:
        value = {"messaging_product": "whatsapp",
                 "metadata": {"display_phone_number": "15550000000", "phone_number_id": self.phone_number_id},
                 "contacts": [{"profile": {"name": "Ann"}, "wa_id": sender}],
                 "messages": [{"from": sender, "id": wamid, "timestamp": str(int(time.time())), "type": "text",
                               "text": {"body": text}}]}
        return {"object": "whatsapp_business_account",
                "entry": [{"id": "WABA1", "changes": [{"value": value, "field": "messages"}]}]}

    def voice(self, *, sender: str, wamid: str, audio: bytes) -> dict[str, Any]:
        """A webhook with a voice note, its audio served at GET /{media id} and the URL that gives."""
        media_id = f"media{len(self.media) + 1}"
        self.media[media_id] = audio
        event = self.event(sender=sender, text="", wamid=wamid)
        message = event["entry"][0]["changes"][0]["value"]["messages"][0]
        del message["text"]
        message.update(type="audio", audio={"id": media_id, "mime_type": "audio/ogg; codecs=opus", "voice": True})
        return event

    def photo(self, *, sender: str, wamid: str, image: bytes, caption: str | None = None) -> dict[str, Any]:
        """A webhook with a photo (and its caption), served as voice notes are."""
        media_id = f"media{len(self.media) + 1}"
        self.media[media_id], self.mime[media_id] = image, "image/jpeg"
        event = self.event(sender=sender, text="", wamid=wamid)
        message = event["entry"][0]["changes"][0]["value"]["messages"][0]
        del message["text"]
        message.update(type="image", image={"id": media_id, "mime_type": "image/jpeg", "sha256": "x",
                                            **({"caption": caption} if caption is not None else {})})
        return event

    def document(self, *, sender: str, wamid: str, content: bytes, name: str, mime: str) -> dict[str, Any]:
        """A webhook with a file, served as voice notes are."""
        media_id = f"media{len(self.media) + 1}"
        self.media[media_id], self.mime[media_id] = content, mime
        event = self.event(sender=sender, text="", wamid=wamid)
        message = event["entry"][0]["changes"][0]["value"]["messages"][0]
        del message["text"]
        message.update(type="document", document={"id": media_id, "filename": name, "mime_type": mime, "sha256": "x"})
        return event

    def status(self, *, recipient: str, wamid: str, status: str, code: int = 131047,
               title: str = "Re-engagement message") -> dict[str, Any]:
        """A status webhook about a message we sent: sent, delivered, read, or failed (with errors)."""
        item: dict[str, Any] = {"id": wamid, "status": status, "timestamp": str(int(time.time())),
                                "recipient_id": recipient}
        if status == "failed":
            item["errors"] = [{"code": code, "title": title, "message": title,
                               "error_data": {"details": "More than 24 hours have passed since the customer "
                                                         "last replied to this number."}}]
        value = {"messaging_product": "whatsapp",
                 "metadata": {"display_phone_number": "15550000000", "phone_number_id": self.phone_number_id},
                 "statuses": [item]}
        return {"object": "whatsapp_business_account",
                "entry": [{"id": "WABA1", "changes": [{"value": value, "field": "messages"}]}]}

    def signed(self, payload: dict[str, Any], *, secret: str | None = None) -> tuple[bytes, dict[str, str]]:
        raw = json.dumps(payload).encode()
        sig = "sha256=" + hmac.new((secret or self.app_secret).encode(), raw, hashlib.sha256).hexdigest()
        return raw, {"Content-Type": "application/json", "X-Hub-Signature-256": sig}


def _error(code: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "OAuthException", "code": code, "fbtrace_id": "x"}}
