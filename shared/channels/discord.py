"""Discord: interactions endpoint in (Ed25519 signature, PING -> PONG, a slash command such as /ask
answered at once with a deferred response), replies out: the interaction's first reply edits the
deferred response, everything else for it follows as follow-up messages (a bot message in the channel
once the interaction token expired). A file goes the same way, as an attachment (Discord's multipart form)."""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
from nacl.exceptions import CryptoError
from nacl.signing import VerifyKey

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
from shared.channels.clients import body, check, download, http, redis_client
from shared.channels.files import worth_fetching
from shared.channels.markdown import identity
from shared.channels.signing import fresh
from shared.constants import KEY_CACHE
from shared.contracts import InboundMessage
from shared.settings import Settings

PING, APPLICATION_COMMAND, COMPONENT, AUTOCOMPLETE, MODAL_SUBMIT = 1, 2, 3, 4, 5  # interaction types
PONG, CHANNEL_MESSAGE, DEFERRED, DEFERRED_UPDATE, AUTOCOMPLETE_RESULT = 1, 4, 5, 6, 8  # response types
STRING, ATTACHMENT = 3, 11  # command option types
EXPIRED = (401, 404)  # what Discord answers for an interaction token that expired (or an unknown one)
CDN_HOSTS = ("cdn.discordapp.com", "media.discordapp.net")  # where attachments are served from
# The slash command nanofleet answers (`nanofleet channels discord register` creates or updates it).
ASK = {"name": "ask", "description": "Ask the agent", "options": [
    {"type": STRING, "name": "question", "description": "What to ask"},
    {"type": ATTACHMENT, "name": "file", "description": "A photo, a PDF or a text file to look at"}]}
# Every interaction needs a valid answer, or the user sees "interaction failed". nanofleet sends no buttons,
# menus or modals and its /ask has no autocomplete, but other commands of the application may: a button, or
# a modal opened from one, is acknowledged with its message left as it is; an autocomplete offers no choices.
ACKNOWLEDGE: dict[int, dict[str, Any]] = {
    COMPONENT: {"type": DEFERRED_UPDATE},
    MODAL_SUBMIT: {"type": DEFERRED_UPDATE},
    AUTOCOMPLETE: {"type": AUTOCOMPLETE_RESULT, "data": {"choices": []}},
}
EPHEMERAL = 64
# A modal opened from a slash command has no message to leave as it is (DEFERRED_UPDATE is only for one
# opened from a component): its submitter is told, privately.
NOT_OURS = "This form is not handled by this bot."
# Another command of the application (a slash or context-menu command someone registered beside /ask)
NOT_OUR_COMMAND = "This command is not handled by this bot: ask with `/ask question: ...`."
NO_MENTIONS: dict[str, list[str]] = {"parse": []}  # a reply never pings @everyone or anyone else
# The largest file a bot may attach in a server without boosts: Discord answers 413 (code 40005) past it.
MAX_FILE = 10 * 1024 * 1024
TOKEN_LIFETIME = 15 * 60  # an interaction token, and with it its @original and follow-ups
# A Discord id (a 64-bit integer in decimal). A chat id goes into the URL path of a bot message: anything
# else (`../guilds/...`, handed to the `message` tool) would reach another API endpoint with the bot's token.
SNOWFLAKE = re.compile(r"[0-9]{1,20}")


def _ephemeral(text: str) -> dict[str, Any]:
    return {"type": CHANNEL_MESSAGE, "data": {"content": text, "flags": EPHEMERAL}}


class DiscordChannel(BaseChannel):
    """A Discord application with slash commands."""

    name: ClassVar[str] = "discord"
    max_chars: ClassVar[int] = 2000
    required: ClassVar[tuple[str, ...]] = ("application_id", "public_key")
    placeholder: ClassVar[bool] = True  # the deferred response's "thinking..."
    ack_deadline: ClassVar[float | None] = 2.5  # Discord's is 3 s, and it never sends an interaction again
    max_file_bytes: ClassVar[int] = MAX_FILE

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.cfg = settings.channels.discord
        try:
            self._key: VerifyKey | None = VerifyKey(bytes.fromhex(self.cfg.public_key or ""))
        except (ValueError, TypeError, CryptoError):
            self._key = None

    # ------------------------------------------------------------------ inbound

    def verify(self, headers: dict[str, str], body: bytes) -> None:
        """Ed25519 over timestamp + body with the application's public key; old timestamps fail."""
        ts, sig = headers.get("x-signature-timestamp", ""), headers.get("x-signature-ed25519", "")
        try:
            if self._key is None or not fresh(ts):
                raise ValueError("no key or stale timestamp")
            self._key.verify(ts.encode() + body, bytes.fromhex(sig))
        except (ValueError, TypeError, CryptoError):
            raise WebhookError(401, "bad or stale X-Signature-Ed25519") from None

    def parse(self, headers: dict[str, str], body: bytes) -> Parsed:
        payload = json_object(body)
        kind = payload.get("type")
        if kind == PING:
            return Parsed(response={"type": PONG})
        if kind == MODAL_SUBMIT and not payload.get("message"):
            return Parsed(response=_ephemeral(NOT_OURS))
        if kind != APPLICATION_COMMAND:
            return Parsed(response=ACKNOWLEDGE.get(kind) if isinstance(kind, int) else None)
        iid, token, channel = payload.get("id"), payload.get("token"), payload.get("channel_id")
        user = (payload.get("member") or {}).get("user") or payload.get("user") or {}
        if not (isinstance(iid, str) and isinstance(token, str) and isinstance(channel, str) and "id" in user):
            raise WebhookError(400, "command without id, token, channel_id or user")
        data: dict[str, Any] = payload["data"] if isinstance(payload.get("data"), dict) else {}
        if data.get("name") != ASK["name"]:
            return Parsed(response=_ephemeral(NOT_OUR_COMMAND), event_id=iid)
        text, attached = _prompt(data), _attachment(data)
        if not (text or attached):
            return Parsed(response=_ephemeral("Ask me something: `/ask question: ...`"), event_id=iid)
        meta = {"interaction_token": token, "application_id": str(payload.get("application_id") or "")}
        msg = InboundMessage(channel=self.name, chat_id=channel, sender_id=str(user["id"]), content=text,
                             event_id=iid, reply_meta=meta, sender_name=user.get("username"),
                             group="guild_id" in payload, media=attached,
                             unsupported=None if text or not attached else f"a {attached['kind']}")
        return Parsed(messages=[msg], response={"type": DEFERRED}, event_id=iid,
                      denied_response=_ephemeral("Sorry, you are not allowed to use this bot."))

    def fetch_media(self, media: dict[str, str], limit: int) -> tuple[bytes, str]:
        """An attachment from Discord's CDN (its URL is signed: no token goes with it), and from nowhere
        else a payload may name."""
        url, api = urlsplit(media["url"]), urlsplit(self.cfg.api_base)
        cdn = url.scheme == "https" and url.hostname in CDN_HOSTS
        if not (cdn or (url.scheme, url.hostname) == (api.scheme, api.hostname)):
            raise Rejected(f"discord attachment: not on {CDN_HOSTS[0]}")
        return download(media["url"], limit=limit, what="discord attachment"), media["name"]

    # ------------------------------------------------------------------ outbound

    def format(self, markdown: str) -> str:
        return identity(markdown)  # Discord renders markdown itself

    def rate_limits(self, chat_id: str) -> list[Bucket]:
        """50 requests per second per bot; about five messages per five seconds per channel."""
        app = self.cfg.application_id or ""
        return [Bucket(f"discord:channel:{chat_id}", 1.0, 5), Bucket(f"discord:app:{app}", 1 / 50, 50)]

    def send(self, chat_id: str, text: str, meta: dict[str, Any]) -> SendResult:
        return self._deliver(chat_id, {"content": text}, meta)

    def send_file(self, chat_id: str, file: OutFile, meta: dict[str, Any]) -> SendResult:
        """The file as the message's one attachment, sent where a text would go: a file that is the
        interaction's first reply (a reply of files only) replaces "thinking..." as text would.
        Discord shows a photo inline by itself."""
        return self._deliver(chat_id, {"attachments": [{"id": 0, "filename": file.name}]}, meta, file)

    def _deliver(self, chat_id: str, message: dict[str, Any], meta: dict[str, Any],
                 file: OutFile | None = None) -> SendResult:
        token = meta.get("interaction_token")
        if not token:
            return self._channel_message(chat_id, message, meta, file)
        try:
            return self._interaction_reply(str(token), message, meta, file)
        except Rejected as err:  # an interaction token lives 15 minutes: then Discord says 401 or 404
            if err.status not in EXPIRED or not self.secret("bot_token"):
                raise  # (a reply refused for itself would be refused in the channel too, or posted twice)
            return self._channel_message(chat_id, message, meta, file)

    def _interaction_reply(self, token: str, message: dict[str, Any], meta: dict[str, Any],
                           file: OutFile | None) -> SendResult:
        """The interaction's first reply edits the deferred "thinking..." response; anything else
        sent with its token (later chunks, a subagent's report, a cron firing or another `message`
        that inherited the reply_meta) is a follow-up, so nothing overwrites an answer already read."""
        app = meta.get("application_id") or self.cfg.application_id
        url = f"{self.cfg.api_base.rstrip('/')}/webhooks/{app}/{token}"
        if self._owns_original(token, meta):
            response = self._request("PATCH", f"{url}/messages/@original", message, file)
        else:
            response = self._request("POST", url, message, file, params={"wait": "true"})
        return self._result(response, "interaction response")

    def _request(self, method: str, url: str, message: dict[str, Any], file: OutFile | None, *,
                 params: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> httpx.Response:
        """The message as JSON; with a file, Discord's multipart form: the message in `payload_json`,
        the file in the part `files[0]` its attachment (id 0) names."""
        payload = {**message, "allowed_mentions": NO_MENTIONS}
        client = http(self.settings.channels.delivery.send_timeout)
        if file is None:
            return client.request(method, url, json=payload, params=params, headers=headers)
        return client.request(method, url, data={"payload_json": json.dumps(payload)},
                              files={"files[0]": (file.name, file.data, file.mime)}, params=params, headers=headers)

    def _owns_original(self, token: str, meta: dict[str, Any]) -> bool:
        """Whether this row is the interaction's first reply. The first chunk 0 to ask takes the
        interaction (atomically, in Redis, for all workers); a resend of that same row still edits."""
        if meta.get("chunk"):
            return False
        cache, row = redis_client(self.settings.redis_url), str(meta.get("outbox_id", ""))
        key = f"{KEY_CACHE}discord:original:{token}"
        if cache.set(key, row, nx=True, ex=TOKEN_LIFETIME):
            return True
        owner = cache.get(key)
        return isinstance(owner, bytes) and owner.decode() == row

    def chat_id_problem(self, chat_id: str) -> str | None:
        if SNOWFLAKE.fullmatch(chat_id):
            return None
        return f"chat id {chat_id[:64]!r} is not a Discord channel id (a snowflake: digits only)"

    def _channel_message(self, chat_id: str, message: dict[str, Any], meta: dict[str, Any],
                         file: OutFile | None) -> SendResult:
        """A bot message; the nonce makes Discord drop a repeat of the same outbox row."""
        if problem := self.chat_id_problem(chat_id):
            raise Rejected(f"discord channel message: {problem}")
        response = self._request(
            "POST", f"{self.cfg.api_base.rstrip('/')}/channels/{chat_id}/messages",
            {**message, "nonce": str(meta.get("outbox_id", ""))[:25], "enforce_nonce": True}, file,
            headers={"Authorization": f"Bot {self.secret('bot_token')}"},
        )
        return self._result(response, "channel message")

    def register(self) -> str:
        """Create the global /ask command, or update it (Discord matches it by name; the application's
        other commands stay), with the bot token; its id."""
        response = http(self.settings.channels.delivery.send_timeout).post(
            f"{self.cfg.api_base.rstrip('/')}/applications/{self.cfg.application_id}/commands", json=ASK,
            headers={"Authorization": f"Bot {self.secret('bot_token')}"},
        )
        return self._result(response, "register /ask").platform_message_id or "?"

    def _result(self, response: Any, what: str) -> SendResult:
        data = body(response)
        wait = data.get("retry_after")
        check(response, what=f"discord {what}", wait=float(wait) if isinstance(wait, int | float) else None)
        return SendResult(str(data.get("id") or "") or None)


def _options(data: dict[str, Any], kind: int) -> list[dict[str, Any]]:
    options = data.get("options")
    return [o for o in options if isinstance(o, dict) and o.get("type", kind) == kind] \
        if isinstance(options, list) else []


def _prompt(data: dict[str, Any]) -> str:
    """The command's text: its first string option (`/ask question: ...`)."""
    for option in _options(data, STRING):
        if isinstance(option.get("value"), str) and option["value"].strip():
            return str(option["value"]).strip()
    return ""


def _attachment(data: dict[str, Any]) -> dict[str, str] | None:
    """The command's first attachment option (`/ask file: ...`): a photo a model takes, or a file
    that may have text to read. Discord sends its id as the option's value, and the file in
    data.resolved.attachments."""
    resolved = (data.get("resolved") or {}).get("attachments") if isinstance(data.get("resolved"), dict) else None
    for option in _options(data, ATTACHMENT):
        found = resolved.get(str(option.get("value"))) if isinstance(resolved, dict) else None
        if not (isinstance(found, dict) and isinstance(found.get("url"), str)):
            continue
        size, mime = found.get("size", 0), found.get("content_type")
        kind = "photo" if mime in IMAGE_TYPES and isinstance(size, int) and size <= MAX_IMAGE else \
            "file" if worth_fetching(mime) else None
        if kind:
            return {"kind": kind, "id": str(found.get("id", "")), "url": found["url"],
                    "name": str(found.get("filename") or kind)}
    return None
