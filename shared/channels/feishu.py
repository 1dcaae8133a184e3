"""Feishu / Lark: event subscription in (url_verification, verification token, optional AES-256-CBC
encrypted bodies with a request signature, event_id dedupe; text and rich-text (post) messages, with
a post's photos; in groups only messages that @-mention the bot, whose open_id is asked of
bot/v3/info), replies out through the IM message API (text, and files uploaded first) with a tenant access
token cached in Redis and refreshed."""

from __future__ import annotations

import json
import logging
import re
from typing import Any, ClassVar

import httpx

from shared.channels import cards
from shared.channels.albums import BURST
from shared.channels.base import (
    MAX_IMAGES,
    BaseChannel,
    Bucket,
    OutFile,
    Parsed,
    RateLimited,
    Rejected,
    SendResult,
    WebhookError,
)
from shared.channels.clients import Learned, PlatformError, body, check, download, http, redis_client, retry_after
from shared.channels.feishu_crypto import EncryptedWithoutKey, check_signature, opened
from shared.channels.feishu_crypto import decrypt as decrypt  # (re-exported: where it used to be)
from shared.channels.markdown import feishu_md
from shared.channels.signing import same
from shared.constants import KEY_CACHE
from shared.contracts import InboundMessage
from shared.settings import Settings

log = logging.getLogger(__name__)
MESSAGE_EVENT = "im.message.receive_v1"
TOKEN_INVALID = {99991661, 99991663, 99991668}  # missing, invalid or expired tenant access token
# Messages without text a person sends in a private chat (answered with a notice unless fetched and read)
MEDIA = {"image": "a photo", "audio": "a voice message", "file": "a file", "media": "a video",
         "sticker": "a sticker", "location": "a location"}
# What else a person sends in a private chat, told apart in the notice (any other kind but a system
# message gets it too, as "that kind of message")
OTHER = {"merge_forward": "forwarded chat history", "share_chat": "a shared group", "share_user": "a shared contact",
         "interactive": "a card", "share_calendar_event": "a calendar event", "todo": "a task", "vote": "a poll"}
FETCHED = {"image": "photo", "audio": "audio", "file": "file"}  # what the worker fetches of them, as which kind
TOKEN_MARGIN = 300  # seconds before expiry a cached token is replaced
THROTTLED = 99991400  # "request trigger frequency limit", answered with HTTP 400 rather than 429
BOT_INFO_TIMEOUT = 3.0  # seconds, for each of the token and bot/v3/info calls
BOT_INFO_PAUSE = 10.0  # seconds after a failed bot/v3/info before the next
MAX_PHOTO = 10 * 1024 * 1024  # im/v1/images' cap: a larger photo goes as a file
FILE_TYPES = ("pdf", "doc", "xls", "ppt")  # im/v1/files' file_type for these extensions; any other is "stream"
# Refusals of a call that are not of its content (the bot not in the chat, its bot ability or a permission
# not granted): a post refused for anything else (230001 invalid parameter, ...) may pass as text
NOT_CONTENT = {230002, 230006, 230013, 230027, 99991672}  # (230013: the bot is not available to the user)


class BadContent(Rejected):
    """Feishu refused the content of a message (im/v1/messages), not the token, the app or the chat."""


class FeishuChannel(BaseChannel):
    """A Feishu (or Lark, with the larksuite API base) custom app with a bot."""

    name: ClassVar[str] = "feishu"
    max_chars: ClassVar[int] = 10_000  # well under the 150 KB text message cap, even fully escaped
    required: ClassVar[tuple[str, ...]] = ("app_id", "app_secret", "verification_token")
    max_file_bytes: ClassVar[int] = 30 * 1024 * 1024  # im/v1/files' cap

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.cfg = settings.channels.feishu
        self._bot_open_id = Learned("the bot's open_id from Feishu (bot/v3/info)", self._bot_info,
                                    pause=BOT_INFO_PAUSE)

    # ------------------------------------------------------------------ inbound

    def decode(self, body: bytes) -> dict[str, Any]:
        """The event as JSON, decrypted when an encrypt key is set (then it must be encrypted; an
        encrypted one without a key is refused, naming the setting)."""
        return opened(body, self.secret("encrypt_key"))

    def verify(self, headers: dict[str, str], body: bytes) -> None:
        """With an encrypt key: the signature over the raw body (every event but the url_verification
        handshake is signed), then the body must decrypt. Always: the verification token inside."""
        key, signed = self.secret("encrypt_key"), "x-lark-signature" in headers
        if key and signed:
            check_signature(headers, body, key)
        try:
            payload = self.decode(body)
        except EncryptedWithoutKey:
            raise
        except WebhookError:
            raise WebhookError(401, "body does not decode to an event") from None
        if key and not signed and payload.get("type") != "url_verification":
            raise WebhookError(401, "unsigned event")
        header = payload.get("header")
        token = header.get("token") if isinstance(header, dict) else payload.get("token")
        if not isinstance(token, str) or not same(token, self.secret("verification_token")):
            raise WebhookError(401, "bad verification token")

    def parse(self, headers: dict[str, str], body: bytes) -> Parsed:
        payload = self.decode(body)
        if payload.get("type") == "url_verification":
            return Parsed(response={"challenge": str(payload.get("challenge", ""))})
        header, event = payload.get("header"), payload.get("event")
        if not (isinstance(header, dict) and isinstance(event, dict)) or header.get("event_type") != MESSAGE_EVENT:
            return Parsed()
        event_id = header.get("event_id")
        if not isinstance(event_id, str):
            raise WebhookError(400, "event without header.event_id")
        inbound = self._inbound(event_id, event)
        return Parsed(messages=[inbound] if inbound else [], event_id=event_id)

    def _inbound(self, event_id: str, event: dict[str, Any]) -> InboundMessage | None:
        msg, sender = event.get("message"), event.get("sender")
        if not (isinstance(msg, dict) and isinstance(sender, dict)):
            raise WebhookError(400, "message event without message or sender")
        if sender.get("sender_type") not in (None, "user"):
            return None
        kind = msg.get("message_type")
        if kind not in ("text", "post"):
            return self._attachment(event_id, msg, sender)
        text, photos = _text(msg.get("content")) if kind == "text" else _post(msg.get("content"))
        mentions = [m for m in msg.get("mentions") or [] if isinstance(m, dict) and isinstance(m.get("key"), str)]
        group = msg.get("chat_type") == "group"
        if group and not mentions:
            return None  # in groups, only messages that @-mention the bot
        bot = self.bot_open_id(ask=bool(mentions))  # whose mentions are the bot's (in a private chat too)
        ours = {m["key"] for m in mentions if bot and (m.get("id") or {}).get("open_id") == bot}
        if group and not ours:
            return None  # they mention someone else (the app may read every group message)
        open_id, chat_id, message_id = (sender.get("sender_id") or {}).get("open_id"), msg.get("chat_id"), \
            msg.get("message_id")
        if not (isinstance(open_id, str) and isinstance(chat_id, str)) or text is None \
                or (photos and not isinstance(message_id, str)):
            raise WebhookError(400, f"message without sender open_id, chat_id or {kind} content")
        media = [{"kind": "photo", "id": key, "message": str(message_id)} for key in photos[:MAX_IMAGES]]
        # (a mention of the bot alone calls it, as on Telegram and Slack: it stays)
        content = _named(text, mentions, drop=ours) or ("" if media else _named(text, mentions, drop=set()))
        if kind == "post" and not (content or media):
            return None  # an empty post: nothing to answer
        return InboundMessage(channel=self.name, chat_id=chat_id, sender_id=open_id, content=content,
                              event_id=event_id, reply_meta={"message_id": message_id}, group=group,
                              unsupported=MEDIA["image"] if media and not content else None,
                              media=media[0] if media else None, more_media=media[1:])

    def _attachment(self, event_id: str, msg: dict[str, Any], sender: dict[str, Any]) -> InboundMessage | None:
        """A message without text in a private chat: a photo, voice message or file for the worker to
        fetch, a location as text, or a notice that only text is read, whatever else it is (in groups it
        is addressed to nobody, and a system message to no one: ignored)."""
        kind, open_id, chat_id = msg.get("message_type"), (sender.get("sender_id") or {}).get("open_id"), \
            msg.get("chat_id")
        if msg.get("chat_type") == "group" or kind == "system":
            return None
        if not (isinstance(open_id, str) and isinstance(chat_id, str) and isinstance(msg.get("message_id"), str)):
            raise WebhookError(400, "message without sender open_id, chat_id or message_id")
        content = _content(msg.get("content"))
        key, name = content.get("image_key" if kind == "image" else "file_key"), str(content.get("file_name") or "")
        media = {"kind": FETCHED[kind], "id": key, "message": msg["message_id"], "name": name} \
            if kind in FETCHED and isinstance(key, str) else None
        card = cards.location(content.get("latitude"), content.get("longitude"), content.get("name")) \
            if kind == "location" else None
        what = MEDIA.get(str(kind)) or OTHER.get(str(kind), "that kind of message")
        return InboundMessage(channel=self.name, chat_id=chat_id, sender_id=open_id, content=card or "",
                              event_id=event_id, reply_meta={"message_id": msg["message_id"]},
                              unsupported=None if card else what, media=media,
                              album=BURST if kind == "image" else None)

    def fetch_media(self, media: dict[str, str], limit: int) -> tuple[bytes, str]:
        """The message's resource (im/v1/messages/{id}/resources/{key}), with the tenant token."""
        kind = "image" if media["kind"] == "photo" else "file"
        url = f"{self.cfg.api_base.rstrip('/')}/im/v1/messages/{media['message']}/resources/{media['id']}"
        auth = {"Authorization": f"Bearer {self.tenant_token()}"}
        data = download(f"{url}?type={kind}", limit=limit, what="feishu message resource", headers=auth)
        return data, f"{media['id']}.{'ogg' if kind == 'file' else 'img'}"

    def bot_open_id(self, *, ask: bool = True) -> str:
        """The bot's open_id, asked of Feishu (bot/v3/info) once and remembered (with ask=False, "" until
        then). Groups cannot do without it, as only a mention of the bot is for the bot: when Feishu does
        not answer, the event is refused (503) for Feishu to send again, rather than dropped or answered."""
        return self._bot_open_id.get(ask=ask)

    def _bot_info(self) -> object:
        """The bot's open_id, from bot/v3/info."""
        bot = self._call("GET", "bot/v3/info", timeout=BOT_INFO_TIMEOUT).get("bot")
        if not isinstance(bot, dict):
            raise PlatformError("feishu bot/v3/info: no bot in the answer")
        return bot.get("open_id")

    # ------------------------------------------------------------------ outbound

    def rate_limits(self, chat_id: str) -> list[Bucket]:
        """Five messages per second to one chat, 50 per second per app."""
        app = self.cfg.app_id or ""
        return [Bucket(f"feishu:chat:{app}:{chat_id}", 0.2, 5), Bucket(f"feishu:app:{app}", 1 / 50, 50)]

    def format(self, markdown: str) -> str:
        return feishu_md(markdown)

    def send(self, chat_id: str, text: str, meta: dict[str, Any]) -> SendResult:
        """A post of one markdown element, which Feishu renders; a post whose content it refuses goes as
        plain text (a last resort, as Telegram's unparsed HTML is). Any other refusal fails the send."""
        key = _uuid(meta)
        try:
            return self._send(chat_id, "post", {"zh_cn": {"content": [[{"tag": "md", "text": text}]]}}, key)
        except BadContent as err:
            log.warning("feishu refused a reply's content as a post, sending it as text: %s", err)
            return self._send(chat_id, "text", {"text": text}, f"{key}:text" if key else "")

    def send_file(self, chat_id: str, file: OutFile, meta: dict[str, Any]) -> SendResult:
        """Uploaded (im/v1/images for a photo up to 10 MB, else im/v1/files), then sent by the key
        Feishu gives it as an image or file message, the way send sends a text."""
        if file.image and len(file.data) <= MAX_PHOTO:
            kind, form = "image", {"image_type": "message"}
        else:
            ext = file.name.rpartition(".")[2].lower()
            kind, form = "file", {"file_type": ext if ext in FILE_TYPES else "stream", "file_name": file.name}
        uploaded = self._call("POST", f"im/v1/{kind}s", timeout=self.settings.channels.delivery.send_timeout,
                              data=form, files={kind: (file.name, file.data, file.mime)})
        key = (uploaded.get("data") or {}).get(f"{kind}_key")
        if not isinstance(key, str) or not key:
            raise PlatformError(f"feishu im/v1/{kind}s: no {kind}_key in the answer")
        return self._send(chat_id, kind, {f"{kind}_key": key}, _uuid(meta))

    def _send(self, chat_id: str, msg_type: str, content: dict[str, Any], key: str) -> SendResult:
        payload = {"receive_id": chat_id, "msg_type": msg_type, "content": json.dumps(content), "uuid": key}
        data = self._call("POST", "im/v1/messages", timeout=self.settings.channels.delivery.send_timeout,
                          params={"receive_id_type": "chat_id"}, json=payload)
        return SendResult(str((data.get("data") or {}).get("message_id") or "") or None)

    def _call(self, method: str, path: str, *, timeout: float, **kw: Any) -> dict[str, Any]:
        """Feishu's answer to a call with the tenant token, once it says code 0 (else RateLimited,
        Rejected, BadContent for the call's own refusal of its content, or PlatformError); a token
        Feishu calls invalid is fetched again, once."""
        what, data = f"feishu {path}", {}
        for fresh_token in (False, True):
            response = http(timeout).request(
                method, f"{self.cfg.api_base.rstrip('/')}/{path}", **kw,
                headers={"Authorization": f"Bearer {self.tenant_token(fresh=fresh_token, timeout=timeout)}"},
            )
            data = body(response)
            if _code(data) not in TOKEN_INVALID:
                try:
                    _check(response, data, what=what)
                except Rejected as err:  # (a 4xx, not throttling)
                    if _code(data) not in NOT_CONTENT:
                        raise BadContent(str(err), err.status) from None
                    raise
                break
        if _code(data) != 0:
            raise PlatformError(f"{what}: {data.get('code')} {data.get('msg')}")
        return data

    def tenant_token(self, *, fresh: bool = False, timeout: float | None = None) -> str:
        """The tenant access token, shared by every worker through Redis until shortly before expiry."""
        cache = redis_client(self.settings.redis_url)
        key = f"{KEY_CACHE}feishu:tenant_token:{self.cfg.app_id}"
        cached = None if fresh else cache.get(key)
        if isinstance(cached, bytes):
            return cached.decode()
        response = http(timeout or self.settings.channels.delivery.send_timeout).post(
            f"{self.cfg.api_base.rstrip('/')}/auth/v3/tenant_access_token/internal",
            json={"app_id": self.cfg.app_id, "app_secret": self.secret("app_secret")},
        )
        data = body(response)
        _check(response, data, what="feishu tenant_access_token")
        token = data.get("tenant_access_token")
        if _code(data) != 0 or not isinstance(token, str):
            raise PlatformError(f"feishu tenant_access_token: {data.get('code')} {data.get('msg')}")
        cache.set(key, token, ex=max(60, int(data.get("expire", 7200)) - TOKEN_MARGIN))
        return token


_MENTION = re.compile(r"([ \t]*)(@_user_\d+)")  # Feishu's placeholder for a mention in a message's text
_LEADING = re.compile(r"(?m)^[ \t]*(@_user_\d+)[ \t]*")  # one that begins a line


def _named(text: str, mentions: list[dict[str, Any]], *, drop: set[str]) -> str:
    """The text with its mention placeholders (@_user_1) as the names they stand for; the bot's own
    (`drop`) go, with the blank before them (after them, at the start of a line)."""
    names = {m["key"]: str(m.get("name") or "someone") for m in mentions}
    text = _LEADING.sub(lambda m: "" if m.group(1) in drop else m.group(0), text)  # with the blank after

    def named(m: re.Match[str]) -> str:
        key = m.group(2)
        if key in drop:
            return ""
        return m.group(1) + (f"@{names[key]}" if key in names else key)

    return _MENTION.sub(named, text).strip()


def _content(content: object) -> dict[str, Any]:
    """A message's content is itself JSON (an object), or {}."""
    try:
        data = json.loads(content) if isinstance(content, str) else None
    except (ValueError, RecursionError):  # (nested deeper than the parser's stack allows)
        return {}
    return data if isinstance(data, dict) else {}


def _text(content: object) -> tuple[str | None, list[str]]:
    """A text message's text ({"text": "..."}), and no photos."""
    text = _content(content).get("text")
    return (text if isinstance(text, str) else None), []


def _post(content: object) -> tuple[str | None, list[str]]:
    """A rich-text message's text, as Markdown where it has some (links, code blocks), its mentions
    left as their placeholders, and the keys of its images. Feishu sends {"title", "content": [[element,
    ...], ...]}, one list per paragraph; the send API's shape, in a language ({"zh_cn": {...}}), is read
    too."""
    post = _content(content)
    post = post.get("post", post) if isinstance(post.get("post"), dict) else post
    if not isinstance(post.get("content"), list):  # in a language: the first that has content
        post = next((v for v in post.values() if isinstance(v, dict) and isinstance(v.get("content"), list)), {})
    paragraphs = post.get("content")
    if not isinstance(paragraphs, list):
        return None, []
    lines, photos = [str(post["title"])] if post.get("title") else [], list[str]()
    for paragraph in paragraphs:
        parts = [_element(e, photos) for e in paragraph if isinstance(e, dict)] if isinstance(paragraph, list) else []
        if any(parts):
            lines.append("".join(parts))
    return "\n".join(lines).strip(), photos


def _element(e: dict[str, Any], photos: list[str]) -> str:
    """One element of a rich-text paragraph as text; an image's key goes to `photos`."""
    tag, text = e.get("tag"), str(e.get("text") or "")
    if tag == "img":
        if isinstance(e.get("image_key"), str):
            photos.append(e["image_key"])
        return ""
    if tag == "a":
        href = str(e.get("href") or "")
        return f"[{text}]({href})" if text and href and text != href else href or text
    if tag == "at":  # "@_user_1", as in a text message, named (or dropped, for the bot) by _named
        user = str(e.get("user_id") or "")
        return user if _MENTION.fullmatch(user) else f"@{e.get('user_name') or user or 'someone'}"
    if tag == "code_block":
        return f"\n```{str(e.get('language') or '').lower()}\n{text.rstrip()}\n```\n"
    if tag == "emotion":
        return f"[{e.get('emoji_type') or 'emoji'}]"
    if tag == "hr":
        return "\n---\n"
    if tag == "media":
        return "[a video]"
    return text  # text, md and whatever else carries text


def _check(response: httpx.Response, data: dict[str, Any], *, what: str) -> None:
    """check(), but Feishu's throttling (code 99991400, whatever the HTTP status) is RateLimited,
    for as long as x-ogw-ratelimit-reset says."""
    reset = response.headers.get("x-ogw-ratelimit-reset", "")
    wait = float(reset) if reset.isdigit() else None
    if _code(data) == THROTTLED:
        raise RateLimited(wait if wait is not None else retry_after(response))
    check(response, what=what, wait=wait)


def _uuid(meta: dict[str, Any]) -> str:
    """The message's uuid, from its outbox row: Feishu drops a repeated uuid within an hour."""
    return str(meta.get("outbox_id", ""))[:45]


def _code(data: dict[str, Any]) -> int | None:
    code = data.get("code")
    return code if isinstance(code, int) else None
