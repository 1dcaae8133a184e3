"""Telegram: Bot API webhook in (secret-token header, update_id dedupe; in groups only what is
addressed to the bot, whose username is configured or asked of getMe), HTML messages out (their
length counted in UTF-16 code units, as Telegram counts) and files (sendPhoto, sendDocument),
"typing..." while a turn runs, and setWebhook for the CLI."""

from __future__ import annotations

import html
import json
import logging
import re
from typing import Any, ClassVar

from shared.channels import cards
from shared.channels.base import (
    IMAGE_TYPES,
    MAX_IMAGE,
    BaseChannel,
    Bucket,
    OutFile,
    Parsed,
    Rejected,
    SendResult,
    WebhookError,
    json_object,
)
from shared.channels.clients import Learned, PlatformError, body, check, download, http
from shared.channels.files import worth_fetching
from shared.channels.markdown import telegram_html
from shared.channels.signing import same
from shared.contracts import InboundMessage
from shared.settings import Settings

log = logging.getLogger(__name__)
GETME_TIMEOUT = 3.0  # seconds
GETME_PAUSE = 10.0  # seconds after a failed getMe before the next
SECRET_HEADER = "x-telegram-bot-api-secret-token"
GROUPS = ("group", "supergroup")
# Messages without text a person sends in a private chat (service messages are not answered)
MEDIA = {"voice": "a voice message", "audio": "an audio file", "video_note": "a video message",
         "video": "a video", "photo": "a photo", "animation": "a GIF", "document": "a file",
         "sticker": "a sticker", "location": "a location", "contact": "a contact", "poll": "a poll",
         "story": "a story", "game": "a game", "paid_media": "paid media", "giveaway": "a giveaway"}
OTHER = "that kind of message"  # a kind the Bot API added since: answered, its keys logged
# What Telegram, not a person, writes in a private chat: not answered
SERVICE = frozenset({"write_access_allowed", "successful_payment", "refunded_payment", "pinned_message",
                     "message_auto_delete_timer_changed", "users_shared", "chat_shared", "connected_website",
                     "passport_data", "proximity_alert_triggered", "chat_background_set", "gift", "unique_gift",
                     "invoice", "web_app_data", "new_chat_members", "left_chat_member", "group_chat_created"})
UNSEEN = {"animation": "a GIF", "video": "a video"}  # what a caption may come with that nobody looks at
AUDIO = ("voice", "audio")  # what a transcription model can turn into text
QUOTE_CHARS = 500
MAX_PHOTO = 10 * 1024 * 1024  # sendPhoto's limit; larger photos go as documents
COMMAND = re.compile(r"/\w+(?:@(\w+))?(?![\w@])")  # /cmd or /cmd@bot_username
LINK = re.compile(r'<a href="([^"]*)">(.*?)</a>', re.DOTALL)  # as telegram_html writes a link


class TelegramChannel(BaseChannel):
    """A Telegram bot."""

    name: ClassVar[str] = "telegram"
    max_chars: ClassVar[int] = 4096  # UTF-16 code units (see measure)
    required: ClassVar[tuple[str, ...]] = ("token", "webhook_secret")
    typing_indicator: ClassVar[bool] = True
    max_file_bytes: ClassVar[int] = 50 * 1024 * 1024  # what a bot may upload

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.cfg = settings.channels.telegram
        self._learned = Learned("the bot's username from Telegram (getMe)", self._get_me, pause=GETME_PAUSE,
                                hint=" (set NANOFLEET_CHANNELS__TELEGRAM__BOT_USERNAME to do without it)")

    # ------------------------------------------------------------------ inbound

    def verify(self, headers: dict[str, str], body: bytes) -> None:
        if not same(headers.get(SECRET_HEADER, ""), self.secret("webhook_secret")):
            raise WebhookError(401, "bad or missing X-Telegram-Bot-Api-Secret-Token")

    def parse(self, headers: dict[str, str], body: bytes) -> Parsed:
        update = json_object(body)
        update_id = update.get("update_id")
        if not isinstance(update_id, int):
            raise WebhookError(400, "update_id missing")
        msg = update.get("message")
        if msg is None:
            return Parsed(event_id=str(update_id))  # edits, callbacks, member updates: not for us
        if not isinstance(msg, dict):
            raise WebhookError(400, "message is not an object")
        inbound = self._inbound(str(update_id), msg)
        return Parsed(messages=[inbound] if inbound else [], event_id=str(update_id))

    def _inbound(self, update_id: str, msg: dict[str, Any]) -> InboundMessage | None:
        chat, sender = msg.get("chat"), msg.get("from")
        if not (isinstance(chat, dict) and isinstance(sender, dict) and "id" in chat and "id" in sender):
            raise WebhookError(400, "message without chat or sender")
        if sender.get("is_bot") and "sender_chat" not in msg:  # (an anonymous admin posts as a bot, for a chat)
            return None  # another bot (groups can deliver them): answering, two bots would talk forever
        text = msg.get("text") or msg.get("caption")
        group, album = chat.get("type") in GROUPS, _album(msg)
        sent = {"channel": self.name, "chat_id": str(chat["id"]), "sender_id": str(sender["id"]), "event_id": update_id,
                "album": album, **_where(msg, chat, sender, group)}
        if not isinstance(text, str):
            if not group and (card := _card(msg)) is not None:
                return InboundMessage(**sent, content=card)
            kind = next((label for key, label in MEDIA.items() if key in msg), None)
            if kind is None and not group and not (SERVICE | {"text", "caption"}) & msg.keys():  # (blank: no answer)
                log.info("telegram: a private message of a kind not read (its keys: %s)", ", ".join(sorted(msg)))
                kind = OTHER
            if kind is None or (group and album is None):
                return None  # in groups nothing without text is addressed to the bot (bar an album's other items)
            return InboundMessage(**sent, content="", unsupported=kind, media=_media(msg), follower=group)
        username = self.username(ask=group)
        if group and not _addressed(msg, text, username):
            return None
        content = _with_quote(msg, _strip_mention(text, username))
        if what := next((label for key, label in UNSEEN.items() if key in msg), None):
            content = cards.unseen(what, content)
        return InboundMessage(**sent, content=content, media=_media(msg) or _replied_to(msg))

    def fetch_media(self, media: dict[str, str], limit: int) -> tuple[bytes, str]:
        """getFile, then the file itself (the Bot API hands out files up to 20 MB)."""
        found = self.call("getFile", {"file_id": media["id"]}).get("result")
        path = found.get("file_path") if isinstance(found, dict) else None
        if not isinstance(path, str) or not path:
            raise Rejected("telegram getFile: no file to download (over 20 MB, or gone)")
        size = found.get("file_size") if isinstance(found, dict) else None
        if isinstance(size, int) and size > limit:
            raise Rejected(f"telegram getFile: the file is over {limit:,} bytes")
        url = f"{self.cfg.api_base.rstrip('/')}/file/bot{self.secret('token')}/{path}"
        return download(url, limit=limit, what="telegram file"), path.rsplit("/", 1)[-1]

    def username(self, *, ask: bool = True) -> str:
        """The bot's username, lower case: configured, else asked of getMe once and remembered (with
        ask=False, "" until then). A bot that is a group admin, or has privacy mode off, gets every
        group message, so groups cannot do without it: when getMe fails the update is refused (503)
        for Telegram to send again, rather than dropped or answered."""
        configured = (self.cfg.bot_username or "").lstrip("@").lower()
        return configured or self._learned.get(ask=ask)

    def _get_me(self) -> str | None:
        me = self.call("getMe", {}, timeout=GETME_TIMEOUT).get("result")
        username = me.get("username") if isinstance(me, dict) else None
        return username.lower() if isinstance(username, str) else None

    # ------------------------------------------------------------------ outbound

    def format(self, markdown: str) -> str:
        return telegram_html(markdown)

    def measure(self, text: str) -> int:
        """What Telegram counts against 4096: the text it shows (tags gone, `&lt;` one character), in
        UTF-16 code units (an emoji outside the BMP is two)."""
        return len(html.unescape(re.sub(r"<[^>]+>", "", text)).encode("utf-16-le")) // 2

    def rate_limits(self, chat_id: str) -> list[Bucket]:
        """About one message per second per chat (20 a minute in groups), 30 per second per bot."""
        per_chat = 3.0 if chat_id.startswith("-") else 1.0
        bot = self.secret("token").split(":", 1)[0]
        return [Bucket(f"telegram:chat:{bot}:{chat_id}", per_chat), Bucket(f"telegram:bot:{bot}", 1 / 30, 30)]

    def send(self, chat_id: str, text: str, meta: dict[str, Any]) -> SendResult:
        payload: dict[str, Any] = {"chat_id": chat_id, "text": text, "parse_mode": "HTML",
                                   "link_preview_options": {"is_disabled": True}, **_addressed_to(meta)}
        try:
            data = self.call("sendMessage", payload)
        except Rejected as err:
            if "can't parse entities" not in str(err):
                raise
            payload.pop("parse_mode")  # our HTML is always balanced; this is a last resort
            payload["text"] = html.unescape(re.sub(r"<[^>]+>", "", LINK.sub(_link_as_text, text)))
            data = self.call("sendMessage", payload)
        return SendResult(str((data.get("result") or {}).get("message_id", "")) or None)

    def send_file(self, chat_id: str, file: OutFile, meta: dict[str, Any]) -> SendResult:
        """A photo as a photo (sendPhoto: up to 10 MB, and within Telegram's dimensions, or it goes as
        a document after all), anything else as a document."""
        fields = {"chat_id": chat_id, **_addressed_to(meta)}
        data: dict[str, Any] | None = None
        if file.image and len(file.data) <= MAX_PHOTO:
            try:
                data = self.call("sendPhoto", fields, upload=("photo", file))
            except Rejected:  # too long or too wide for a photo, say
                data = None
        if data is None:
            data = self.call("sendDocument", fields, upload=("document", file))
        return SendResult(str((data.get("result") or {}).get("message_id", "")) or None)

    def typing(self, chat_id: str, meta: dict[str, Any]) -> bool:
        payload: dict[str, Any] = {"chat_id": chat_id, "action": "typing"}
        if meta.get("message_thread_id"):
            payload["message_thread_id"] = meta["message_thread_id"]
        self.call("sendChatAction", payload)
        return True

    def set_webhook(self, url: str, *, drop_pending: bool = False, commands: dict[str, str] | None = None) -> str:
        """Point Telegram at `url` with our secret token, and list `commands` (name -> description)
        in the bot's command menu; returns Telegram's description."""
        data = self.call("setWebhook", {"url": url, "secret_token": self.secret("webhook_secret"),
                                        "allowed_updates": ["message"], "drop_pending_updates": drop_pending})
        if commands:
            self.call("setMyCommands", {"commands": [{"command": name, "description": about}
                                                     for name, about in commands.items()]})
        return str(data.get("description", "ok"))

    def call(self, method: str, payload: dict[str, Any], timeout: float | None = None,
             upload: tuple[str, OutFile] | None = None) -> dict[str, Any]:
        """One Bot API call; the token goes in the URL path, as the Bot API wants. With `upload`
        (the field and the file), a multipart form of the payload's fields (objects in JSON) and the file."""
        url = f"{self.cfg.api_base.rstrip('/')}/bot{self.secret('token')}/{method}"
        client = http(timeout or self.settings.channels.delivery.send_timeout)
        if upload is None:
            response = client.post(url, json=payload)
        else:
            field, file = upload
            fields = {k: json.dumps(v) if isinstance(v, dict | list) else str(v) for k, v in payload.items()}
            response = client.post(url, data=fields, files={field: (file.name, file.data, file.mime)})
        data = body(response)
        parameters = data.get("parameters") or {}
        moved = parameters.get("migrate_to_chat_id")
        if response.status_code == 400 and isinstance(moved, int) and str(moved) != str(payload.get("chat_id", moved)):
            # The group became a supergroup (a new chat id): what was on its way goes there.
            log.info("telegram: chat %s is now supergroup %s; sending there", payload["chat_id"], moved)
            return self.call(method, {**payload, "chat_id": moved}, timeout, upload)
        wait = parameters.get("retry_after")
        check(response, what=f"telegram {method}", wait=float(wait) if isinstance(wait, int | float) else None)
        if data.get("ok") is not True:
            raise PlatformError(f"telegram {method}: {data.get('description', 'not ok')}")
        return data


def _addressed_to(meta: dict[str, Any]) -> dict[str, Any]:
    """Where a reply goes within its chat: the reply's first message answers the message it replies
    to (if that is gone, it is sent all the same), every message goes to the topic it came from."""
    where: dict[str, Any] = {}
    if meta.get("reply_to_message_id") and not meta.get("chunk"):
        where["reply_parameters"] = {"message_id": meta["reply_to_message_id"], "allow_sending_without_reply": True}
    if meta.get("message_thread_id"):
        where["message_thread_id"] = meta["message_thread_id"]
    return where


def _link_as_text(link: re.Match[str]) -> str:
    return link[2] if html.unescape(link[2]) == html.unescape(link[1]) else f"{link[2]} ({link[1]})"


def _addressed(msg: dict[str, Any], text: str, username: str) -> bool:
    """In groups: a mention of the bot, a reply to it, or a command for it (`/cmd`, or
    `/cmd@<our username>`: `/start@otherbot` is another bot's and would cost a turn, even in a reply to us)."""
    replied = ((msg.get("reply_to_message") or {}).get("from") or {}).get("username") or ""
    command = COMMAND.match(text)
    mentioned = _mention(username).search(text) is not None
    if command is not None and command.group(1) and command.group(1).lower() != username:
        return mentioned  # another bot's command: ours only if it names us too
    return mentioned or replied.lower() == username or command is not None


def _mention(username: str) -> re.Pattern[str]:
    """@username as a word of its own: not inside an email address or a domain (ann@bot.example.com)."""
    return re.compile(rf"(?<![\w@.])@{re.escape(username)}(?!\w|\.\w)", flags=re.IGNORECASE)


def _strip_mention(text: str, username: str) -> str:
    """The text without the bot's mentions; a command addressed to it (`/new@bot`) as the command. In
    a private chat (`username` not asked for) any `@name` after a command is the bot's: no other
    bot is there."""
    name = re.escape(username) if username else r"\w+"
    text = re.sub(rf"^(/\w+)@{name}\b", r"\1", text, flags=re.IGNORECASE)  # /new@bot: /new
    return _mention(username).sub("", text).strip() or text if username else text


def _with_quote(msg: dict[str, Any], text: str) -> str:
    """A reply carries the message it answers, quoted, so the agent knows what "this" is; a command
    sent as a reply is the command alone (quoted, it was no command and went to the model)."""
    if text.startswith("/"):
        return text
    quoted = msg.get("reply_to_message") or {}
    original = quoted.get("text") or quoted.get("caption") if isinstance(quoted, dict) else None
    if not isinstance(original, str) or not original:
        return text
    lines = original[:QUOTE_CHARS].splitlines() or [""]
    return "\n".join("> " + line for line in lines) + "\n\n" + text


def _replied_to(msg: dict[str, Any]) -> dict[str, str] | None:
    """The voice message, photo or file of the message a reply answers ("what is this?" to a photo
    sent earlier, "what did she say?" to a voice message)."""
    quoted = msg.get("reply_to_message")
    return _media(quoted) if isinstance(quoted, dict) else None


def _where(msg: dict[str, Any], chat: dict[str, Any], sender: dict[str, Any], group: bool) -> dict[str, Any]:
    """Where the message belongs and its reply goes (in groups a reply to it; in a topic, the topic, a
    conversation of its own), and who sent it."""
    where: dict[str, Any] = {"group": group, "sender_name": sender.get("username") or sender.get("first_name"),
                             "reply_meta": {"reply_to_message_id": msg.get("message_id")} if group else {}}
    if msg.get("is_topic_message") and msg.get("message_thread_id"):
        where["reply_meta"]["message_thread_id"] = msg["message_thread_id"]
        where["session_key"] = f"telegram:{chat['id']}:{msg['message_thread_id']}"
    return where


def _card(msg: dict[str, Any]) -> str | None:
    """A location, venue, contact or dice roll the message shares, as text (shared.channels.cards)."""
    venue, place, person, rolled = msg.get("venue"), msg.get("location"), msg.get("contact"), msg.get("dice")
    if isinstance(venue, dict) and isinstance(venue.get("location"), dict):
        at = venue["location"]
        return cards.location(at.get("latitude"), at.get("longitude"), venue.get("title"), venue.get("address"))
    if isinstance(place, dict):
        return cards.location(place.get("latitude"), place.get("longitude"))
    if isinstance(person, dict):
        name = " ".join(p for p in (person.get("first_name"), person.get("last_name")) if isinstance(p, str))
        return cards.contact(name, [person.get("phone_number")], [])
    if isinstance(rolled, dict):
        return cards.dice(rolled.get("emoji"), rolled.get("value"))
    return None


def _album(msg: dict[str, Any]) -> str | None:
    """The album (media group) the message is an item of. In groups only an item with a caption can
    address the bot: the others follow it (shared.channels.albums)."""
    group = msg.get("media_group_id")
    return group if isinstance(group, str) and group else None


def _media(msg: dict[str, Any]) -> dict[str, str] | None:
    """The voice message's, audio file's, photo's or document's id on Telegram, for the worker to fetch."""
    for kind in AUDIO:
        item = msg.get(kind)
        if isinstance(item, dict) and isinstance(item.get("file_id"), str):
            return {"kind": kind, "id": item["file_id"]}
    return _photo(msg) or _file(msg)


def _file(msg: dict[str, Any]) -> dict[str, str] | None:
    """A document's id and name, for shared.channels.files to read its text (not a picture, sound or film)."""
    doc = msg.get("document")
    if not (isinstance(doc, dict) and isinstance(doc.get("file_id"), str)) \
            or not worth_fetching(doc.get("mime_type")):
        return None
    return {"kind": "file", "id": doc["file_id"], "name": str(doc.get("file_name") or "")}


def _photo(msg: dict[str, Any]) -> dict[str, str] | None:
    """A photo's id: the largest of its sizes under MAX_IMAGE, or an image sent as a file."""
    sizes = msg.get("photo")
    if isinstance(sizes, list):
        fitting = [p["file_id"] for p in sizes if isinstance(p, dict) and isinstance(p.get("file_id"), str)
                   and isinstance(p.get("file_size", 0), int) and p.get("file_size", 0) <= MAX_IMAGE]
        return {"kind": "photo", "id": fitting[-1]} if fitting else None
    doc = msg.get("document")
    if isinstance(doc, dict) and doc.get("mime_type") in IMAGE_TYPES and isinstance(doc.get("file_id"), str):
        name = doc.get("file_name")  # (what a kept photo is named: shared.channels.saved)
        return {"kind": "photo", "id": doc["file_id"], **({"name": name} if isinstance(name, str) and name else {})}
    return None
