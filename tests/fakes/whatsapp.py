"""A fake WhatsApp Cloud API (Graph API /{phone_number_id}/messages with `Authorization: Bearer`)
and webhooks signed as Meta signs them (X-Hub-Signature-256, HMAC of the raw body)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.platform import Call, FakePlatform


class FakeWhatsApp(FakePlatform):
    message_ops = ("messages",)

    def __init__(self, access_token: str, app_secret: str, phone_number_id: str) -> None:
        self.access_token, self.app_secret, self.phone_number_id = access_token, app_secret, phone_number_id
        self.sent_ids = 0
        self.media: dict[str, bytes] = {}  # media id -> content, for GET /{media id} and its download URL
        self.mime: dict[str, str] = {}  # media id -> its type, where not a voice note's
        super().__init__()

    def routes(self) -> list[Route]:
        return [Route("/{number}/messages", self._post, methods=["POST"]),
                Route("/download/{media_id}", self._download, methods=["GET"]),
                Route("/{media_id}", self._media_url, methods=["GET"])]

    def chat_of(self, call: Call) -> str:
        return str(call.body.get("to"))

    def text_of(self, call: Call) -> str:
        return str((call.body.get("text") or {}).get("body"))

    async def _post(self, request: Request) -> Response:
        return await self.answer("messages", request, self._handle)

    def _handle(self, body: dict[str, Any], request: Request) -> tuple[int, Any]:
        if request.headers.get("authorization") != f"Bearer {self.access_token}":
            self.refuse("messages without the access token")
            return 401, _error(190, "Invalid OAuth access token")
        if request.path_params["number"] != self.phone_number_id:
            self.refuse("messages for an unknown phone number id")
            return 400, _error(100, "Unsupported post request")
        text = (body.get("text") or {}).get("body")
        if body.get("messaging_product") != "whatsapp" or body.get("type") != "text" or not isinstance(text, str):
            self.refuse(f"bad message payload {body}")
            return 400, _error(100, "Invalid parameter")
        if not text.strip() or len(text) > 4096:
            self.refuse(f"text body of {len(text)} characters")
            return 400, _error(100, "Param text['body'] must be at most 4096 characters long")
        wamid = self.next_wamid()
        self.sent_ids += 1
        return 200, {"messaging_product": "whatsapp", "contacts": [{"input": body["to"], "wa_id": body["to"]}],
                     "messages": [{"id": wamid}]}

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
