"""The generic webhook: HMAC-signed JSON messages in from any system, replies POSTed (signed the
same way, with an Idempotency-Key) to the configured callback URL.

Signing, both ways: X-Nanofleet-Timestamp is the Unix time in seconds and X-Nanofleet-Signature is
"sha256=" + hex HMAC-SHA256(secret, timestamp + "." + raw body). Inbound body:
{"id": unique event id, "chat_id": ..., "sender_id": ..., "text": ..., "sender_name"?: ..., "meta"?: {...}}.
Outbound body: {"id", "chat_id", "text", "in_reply_to", "meta", "chunk", "chunks"}, and for a file the
agent sends, "file": {"name", "mime", "data": base64} with an empty text.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any, ClassVar

from shared.channels.base import BaseChannel, OutFile, Parsed, SendResult, WebhookError, json_object
from shared.channels.clients import body, check, http
from shared.channels.markdown import identity
from shared.channels.signing import fresh, hmac_hex, same
from shared.contracts import InboundMessage
from shared.settings import Settings

TIMESTAMP_HEADER = "x-nanofleet-timestamp"
SIGNATURE_HEADER = "x-nanofleet-signature"
MAX_META_BYTES = 2048


def sign(secret: str, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac_hex(secret, timestamp.encode() + b"." + body)


class WebhookChannel(BaseChannel):
    """Any system that can sign a JSON POST and receive one."""

    name: ClassVar[str] = "webhook"
    max_chars: ClassVar[int] = 16_000
    required: ClassVar[tuple[str, ...]] = ("secret", "callback_url")
    max_file_bytes: ClassVar[int] = 25 * 1024 * 1024  # a third more in base64

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.cfg = settings.channels.webhook

    def verify(self, headers: dict[str, str], body: bytes) -> None:
        ts = headers.get(TIMESTAMP_HEADER, "")
        secret = self.secret("secret")
        if not (secret and fresh(ts) and same(headers.get(SIGNATURE_HEADER, ""), sign(secret, ts, body))):
            raise WebhookError(401, "bad or stale X-Nanofleet-Signature")

    def parse(self, headers: dict[str, str], body: bytes) -> Parsed:
        payload = json_object(body)
        fields = {k: payload.get(k) for k in ("id", "chat_id", "sender_id", "text")}
        missing = [k for k, v in fields.items() if not isinstance(v, str) or not v]
        if missing:
            raise WebhookError(400, f"missing or empty string field(s): {', '.join(missing)}")
        meta = payload.get("meta") or {}
        if not isinstance(meta, dict) or len(json.dumps(meta)) > MAX_META_BYTES:
            raise WebhookError(400, f"meta must be an object of at most {MAX_META_BYTES} bytes")
        name = payload.get("sender_name")
        msg = InboundMessage(
            channel=self.name, chat_id=str(fields["chat_id"]), sender_id=str(fields["sender_id"]),
            content=str(fields["text"]), event_id=str(fields["id"]),
            reply_meta={"in_reply_to": fields["id"], "meta": meta}, sender_name=name if isinstance(name, str) else None,
        )
        return Parsed(messages=[msg], event_id=str(fields["id"]))

    def format(self, markdown: str) -> str:
        return identity(markdown)  # the receiver decides how to render markdown

    def send(self, chat_id: str, text: str, meta: dict[str, Any]) -> SendResult:
        return self._post(chat_id, meta, {"text": text})

    def send_file(self, chat_id: str, file: OutFile, meta: dict[str, Any]) -> SendResult:
        """The file in the JSON body: its name, MIME type and bytes in base64 (the text is empty)."""
        return self._post(chat_id, meta, {"text": "", "file": {
            "name": file.name, "mime": file.mime, "data": base64.b64encode(file.data).decode()}})

    def _post(self, chat_id: str, meta: dict[str, Any], content: dict[str, Any]) -> SendResult:
        payload = {"id": meta.get("outbox_id"), "chat_id": chat_id, **content,
                   "in_reply_to": meta.get("in_reply_to"), "meta": meta.get("meta") or {},
                   "chunk": meta.get("chunk", 0), "chunks": meta.get("chunks", 1)}
        raw = json.dumps(payload).encode()
        ts = str(int(time.time()))
        headers = {"Content-Type": "application/json", "X-Nanofleet-Timestamp": ts,
                   "X-Nanofleet-Signature": sign(self.secret("secret"), ts, raw),
                   "Idempotency-Key": str(meta.get("outbox_id", ""))}
        response = http(self.settings.channels.delivery.send_timeout).post(
            str(self.cfg.callback_url), content=raw, headers=headers)
        check(response, what="webhook callback", see_other=True)
        return SendResult(str(body(response).get("id") or "") or None)
