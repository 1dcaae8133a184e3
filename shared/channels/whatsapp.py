"""WhatsApp Cloud API: GET verification handshake, X-Hub-Signature-256 webhooks in (message id
dedupe), plain-text replies and files (uploaded to /media, then sent by id) out through the Graph API
messages endpoint."""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar

import httpx

from shared.channels import cards
from shared.channels.albums import BURST
from shared.channels.base import (
    BaseChannel,
    Bucket,
    OutFile,
    Parsed,
    RateLimited,
    Rejected,
    SendResult,
    WebhookError,
    image_type,
    json_object,
)
from shared.channels.clients import DOWNLOAD_TIMEOUT, PlatformError, body, check, download, http
from shared.channels.files import worth_fetching
from shared.channels.markdown import whatsapp_text
from shared.channels.signing import hmac_hex, same
from shared.contracts import InboundMessage
from shared.settings import Settings

log = logging.getLogger(__name__)
# WhatsApp retries a webhook for up to 7 days. Its signature has no timestamp, so a message older than
# that is a replayed request (the ledger keeps ids only so long: see shared/housekeeping.py).
MAX_AGE = 7 * 24 * 3600  # seconds

# Graph API error codes that mean "slow down", and how long to wait (seconds).
THROTTLED = {4: 60.0, 80007: 60.0, 130429: 1.0, 131056: 6.0}
CAPTIONED = ("image", "video", "document")
WORDS = {"text": "body", "button": "text", **{kind: "caption" for kind in CAPTIONED}}  # where a message's are
KINDS = {"audio": "audio", "image": "photo", "document": "file"}  # WhatsApp's media types the worker fetches
# Messages without text a person sends, named in the notice that only text is read
MEDIA = {"audio": "a voice message", "image": "a photo", "video": "a video", "document": "a file",
         "sticker": "a sticker", "location": "a location", "contacts": "a contact"}
# Any other type gets the notice as this: `unsupported` (a poll, an event: the Cloud API passes on no content),
# `order`, an `interactive` reply other than a button's or a list item's, whatever Meta adds next.
OTHER = "that kind of message"
# Not answered: a reaction, a system message (a number changed), `request_welcome` (someone opened the chat
# for the first time, and sent nothing), and a blank text.
UNANSWERED = ("reaction", "system", "request_welcome", "text")
# Meta's "Supported media types": a JPEG or PNG up to 5 MB shows as a photo, a document may be 100 MB, and
# /media refuses a document of a type not listed here.
PHOTO_LIMIT = 5 * 1024 * 1024
DOCUMENT_LIMIT = 100 * 1024 * 1024
DOCUMENTS = frozenset({
    "text/plain", "application/pdf", "application/msword", "application/vnd.ms-excel", "application/vnd.ms-powerpoint",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation"})
TEXTUAL = ("application/json", "application/xml", "application/yaml", "application/x-yaml")  # text, not text/*


class WhatsAppChannel(BaseChannel):
    """A WhatsApp Business phone number on the Cloud API."""

    name: ClassVar[str] = "whatsapp"
    max_chars: ClassVar[int] = 4096
    required: ClassVar[tuple[str, ...]] = ("access_token", "app_secret", "verify_token", "phone_number_id")
    reports_failures: ClassVar[bool] = True  # `failed` statuses
    typing_indicator: ClassVar[bool] = True  # with the read receipt of the message being answered
    typing_every: ClassVar[float] = 20.0  # WhatsApp shows it for 25 s
    max_file_bytes: ClassVar[int] = DOCUMENT_LIMIT  # a JPEG or PNG over PHOTO_LIMIT goes as a document

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.cfg = settings.channels.whatsapp

    # ------------------------------------------------------------------ inbound

    def handshake(self, params: dict[str, str]) -> str | None:
        """The GET verification: echo hub.challenge when hub.verify_token is ours."""
        if params.get("hub.mode") != "subscribe":
            return None
        if not same(params.get("hub.verify_token", ""), self.secret("verify_token")):
            return None
        return params.get("hub.challenge", "")

    def verify(self, headers: dict[str, str], body: bytes) -> None:
        expected = "sha256=" + hmac_hex(self.secret("app_secret"), body)
        if not self.secret("app_secret") or not same(headers.get("x-hub-signature-256", ""), expected):
            raise WebhookError(401, "bad or missing X-Hub-Signature-256")

    def parse(self, headers: dict[str, str], body: bytes) -> Parsed:
        payload = json_object(body)
        if payload.get("object") != "whatsapp_business_account":
            return Parsed()
        parsed = Parsed()
        for entry in _objects(payload, "entry"):
            for change in _objects(entry, "changes"):
                value = change.get("value")
                if isinstance(value, dict) and self._ours(value):
                    parsed.messages += self._messages(value)
                    parsed.undelivered.update(_failed(value))
        return parsed

    def _ours(self, value: dict[str, Any]) -> bool:
        """Sent to (or, for statuses, from) our number: an app subscribed for several numbers of a
        business gets their webhooks too, and those are for whoever serves those numbers."""
        metadata = value.get("metadata")
        number = metadata.get("phone_number_id") if isinstance(metadata, dict) else None
        return number is not None and str(number) == self.cfg.phone_number_id

    def _messages(self, value: dict[str, Any]) -> list[InboundMessage]:
        names = {c.get("wa_id"): _name(c) for c in _objects(value, "contacts")}
        out = []
        for m in _objects(value, "messages"):
            sender, wamid, text = m.get("from"), m.get("id"), _text(m) or _card(m)
            if not (isinstance(sender, str) and isinstance(wamid, str)):
                raise WebhookError(400, "message without from or id")
            if _stale(m.get("timestamp")):
                log.warning("whatsapp: message %s was sent more than 7 days ago; ignored as a replay", wamid)
                continue
            kind = None if text else _kind(m, wamid)
            media = _media(m) if kind or m.get("type") in ("image", "document") else None
            if text or kind:
                out.append(InboundMessage(channel=self.name, chat_id=sender, sender_id=sender, content=text or "",
                                          event_id=wamid, reply_meta={"reply_to": wamid},
                                          sender_name=names.get(sender), unsupported=kind, media=media,
                                          album=BURST if m.get("type") == "image" else None))
        return out

    def fetch_media(self, media: dict[str, str], limit: int) -> tuple[bytes, str]:
        """The media's URL from the Graph API, then the file, both with the access token."""
        auth = self._auth()
        response = http(self.settings.channels.delivery.send_timeout).get(
            f"{self.cfg.api_base.rstrip('/')}/{media['id']}", headers=auth)
        check(response, what="whatsapp media")
        found = body(response)
        url, size = found.get("url"), found.get("file_size")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise Rejected("whatsapp media: no URL to download it from")
        if isinstance(size, int) and size > limit:
            raise Rejected(f"whatsapp media: the file is over {limit:,} bytes")
        extension = str(found.get("mime_type") or "audio/ogg").split(";")[0].split("/")[-1]
        return download(url, limit=limit, what="whatsapp media", headers=auth), f"{media['id']}.{extension}"

    # ------------------------------------------------------------------ outbound

    def format(self, markdown: str) -> str:
        return whatsapp_text(markdown)

    def rate_limits(self, chat_id: str) -> list[Bucket]:
        """Pair limit: one message per 6 s to a user, with bursts; 80 per second per phone number."""
        number = self.cfg.phone_number_id or ""
        return [Bucket(f"whatsapp:to:{number}:{chat_id}", 6.0, 20), Bucket(f"whatsapp:number:{number}", 1 / 80, 80)]

    def typing(self, chat_id: str, meta: dict[str, Any]) -> bool:
        """Mark the message being answered read (blue ticks) and show "typing...", which WhatsApp shows
        for 25 s or until the reply."""
        if not meta.get("reply_to"):
            return False
        response = http(self.settings.channels.delivery.send_timeout).post(
            self._endpoint("messages"), headers=self._auth(), json={
                "messaging_product": "whatsapp", "status": "read", "message_id": meta["reply_to"],
                "typing_indicator": {"type": "text"}})
        _answer(response, what="whatsapp typing indicator")
        return True

    def send(self, chat_id: str, text: str, meta: dict[str, Any]) -> SendResult:
        return self._message(chat_id, meta, type="text", text={"preview_url": False, "body": text})

    def send_file(self, chat_id: str, file: OutFile, meta: dict[str, Any]) -> SendResult:
        """Upload the file, then send its media id: a JPEG or PNG within PHOTO_LIMIT as a photo, anything
        else as a document under its name. A message that fails after its upload leaves that media unused
        (WhatsApp deletes it after 30 days): a retry uploads the file again."""
        media_id = self._upload(file)
        if file.image and len(file.data) <= PHOTO_LIMIT:
            return self._message(chat_id, meta, type="image", image={"id": media_id})
        return self._message(chat_id, meta, type="document", document={"id": media_id, "filename": file.name})

    def _message(self, chat_id: str, meta: dict[str, Any], **content: Any) -> SendResult:
        """POST /messages with `content` (the type and its object); the first chunk of a reply quotes
        the message it answers."""
        payload: dict[str, Any] = {"messaging_product": "whatsapp", "recipient_type": "individual", "to": chat_id,
                                   **content}
        if meta.get("reply_to") and not meta.get("chunk"):
            payload["context"] = {"message_id": meta["reply_to"]}
        response = http(self.settings.channels.delivery.send_timeout).post(
            self._endpoint("messages"), json=payload, headers=self._auth())
        data = _answer(response, what="whatsapp messages")
        ids = [m.get("id") for m in data.get("messages") or [] if isinstance(m, dict)]
        return SendResult(str(ids[0]) if ids and ids[0] else None)

    def _upload(self, file: OutFile) -> str:
        """POST /media (multipart): the id WhatsApp gave the file. Meta reads the file part's type, not
        only the `type` field, so both say the same."""
        kind = _upload_type(file)
        # A large file takes a while to send and for Meta to take in: the download's patience, not a send's.
        response = http(DOWNLOAD_TIMEOUT).post(
            self._endpoint("media"), headers=self._auth(), data={"messaging_product": "whatsapp", "type": kind},
            files={"file": (file.name, file.data, kind)})
        media_id = _answer(response, what="whatsapp media upload").get("id")
        if not isinstance(media_id, str) or not media_id:
            raise PlatformError("whatsapp media upload: the answer gave no media id")
        return media_id

    def _endpoint(self, op: str) -> str:
        return f"{self.cfg.api_base.rstrip('/')}/{self.cfg.phone_number_id}/{op}"

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret('access_token')}"}


def _answer(response: httpx.Response, *, what: str) -> dict[str, Any]:
    """The Graph API's JSON answer; RateLimited for its throttling codes (whatever the HTTP status),
    else as check() maps the status."""
    data = body(response)
    error = data.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, int) and code in THROTTLED:
        raise RateLimited(THROTTLED[code])
    check(response, what=what)
    return data


def _upload_type(file: OutFile) -> str:
    """The type a file is uploaded as: a photo's read from its bytes; a text file of a type WhatsApp does
    not list (Markdown, CSV, JSON...) as text/plain, its name keeping its extension; else its own (one
    WhatsApp does not take, the upload refuses: Rejected)."""
    if file.image:
        return image_type(file.data) or file.mime
    mime = file.mime.split(";")[0].strip().lower()
    if mime not in DOCUMENTS and (mime.startswith("text/") or mime in TEXTUAL):
        return "text/plain"
    return mime


def _objects(parent: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = parent.get(key) or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise WebhookError(400, f"{key} is not a list of objects")
    return items


def _failed(value: dict[str, Any]) -> dict[str, str]:
    """Our sent messages that WhatsApp reports as failed (outside the 24-hour window, the number
    not on WhatsApp...): wamid -> the error; sent, delivered and read statuses change nothing."""
    out = {}
    for status in _objects(value, "statuses"):
        wamid = status.get("id")
        if status.get("status") != "failed" or not isinstance(wamid, str):
            continue
        errors = [e for e in status.get("errors") or [] if isinstance(e, dict)]
        out[wamid] = "; ".join(_error_text(e) for e in errors) or "WhatsApp reported the message as failed"
    return out


def _error_text(error: dict[str, Any]) -> str:
    data = error.get("error_data")
    details = data.get("details") if isinstance(data, dict) else None
    words = [str(w) for w in (error.get("title") or error.get("message"), details) if w]
    return f"WhatsApp error {error.get('code')}: " + ": ".join(words)


def _name(contact: dict[str, Any]) -> str | None:
    profile = contact.get("profile")
    name = profile.get("name") if isinstance(profile, dict) else None
    return name if isinstance(name, str) else None


def _media(message: dict[str, Any]) -> dict[str, str] | None:
    """A voice note's, photo's or document's media id (and a document's name), for the worker to fetch."""
    kind = message.get("type")
    part = message.get(str(kind))
    if kind not in KINDS or not isinstance(part, dict) or not isinstance(part.get("id"), str) \
            or (kind == "document" and not worth_fetching(part.get("mime_type"))):
        return None
    found = {"kind": KINDS[kind], "id": part["id"]}
    if kind == "document":
        found["name"] = str(part.get("filename") or "")
    return found


def _kind(message: dict[str, Any], wamid: str) -> str | None:
    """What a message without text is called in the notice its sender gets; None for one not answered."""
    kind = str(message.get("type"))
    if kind in MEDIA or kind in UNANSWERED:
        return MEDIA.get(kind)
    errors = "; ".join(_error_text(e) for e in _dicts(message, "errors"))  # (`unsupported`'s say why)
    log.info("whatsapp: message %s is of type %r, which is not read%s; its sender is told so", wamid, kind,
             f" ({errors})" if errors else "")
    return OTHER


def _card(message: dict[str, Any]) -> str | None:
    """A location or the contacts the message shares, as text (shared.channels.cards)."""
    kind, place = message.get("type"), message.get("location")
    if kind == "location" and isinstance(place, dict):
        return cards.location(place.get("latitude"), place.get("longitude"), place.get("name"), place.get("address"))
    if kind != "contacts":
        return None
    shared = [cards.contact(_full_name(c), [p.get("phone") for p in _dicts(c, "phones")],
                            [e.get("email") for e in _dicts(c, "emails")]) for c in _dicts(message, "contacts")]
    return "\n".join(c for c in shared if c) or None


def _dicts(parent: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The objects listed under `key`, whatever else is there (a card is read as far as it can be)."""
    items = parent.get(key)
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _full_name(contact: dict[str, Any]) -> object:
    name = contact.get("name")
    return name.get("formatted_name") if isinstance(name, dict) else None


def _text(message: dict[str, Any]) -> str | None:
    """The words of a text, a caption (after the line saying what the model cannot see, for a video),
    or the button or list item the person tapped (a template's quick reply, an interactive message's)."""
    kind = str(message.get("type"))
    part, field = message.get(kind), WORDS.get(kind)
    if kind == "interactive" and isinstance(part, dict):
        part, field = part.get("button_reply") or part.get("list_reply"), "title"
    text = part.get(field) if isinstance(part, dict) and field else None
    if not (isinstance(text, str) and text.strip()):
        return None
    return cards.unseen("a video", text) if kind == "video" else text


def _stale(timestamp: object) -> bool:
    """A message's `timestamp` (Unix seconds, as a string) older than MAX_AGE; one that is missing or
    malformed is judged by the ledger alone."""
    try:
        sent = int(str(timestamp))
    except ValueError:
        return False
    return time.time() - sent > MAX_AGE
