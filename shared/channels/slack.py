"""Slack: Events API in (v0 signature, url_verification; DMs and mentions), mrkdwn replies and files
(Slack's external upload) out in the thread of the message, one session per thread.

The ledger key of a message is its channel and `ts`, not the event's id: Slack sends one message
more than once under new event ids (an edit of a mention comes again as `app_mention`; a mention in
a DM comes as `message.im` and `app_mention`), and its retries keep the `ts` as well."""

from __future__ import annotations

import re
from typing import Any, ClassVar
from urllib.parse import urlsplit

from slack_sdk.signature import SignatureVerifier

from shared.channels.base import (
    IMAGE_TYPES,
    MAX_IMAGE,
    MAX_IMAGES,
    BaseChannel,
    Bucket,
    OutFile,
    Parsed,
    Rejected,
    SendResult,
    WebhookError,
    json_object,
)
from shared.channels.clients import DOWNLOAD_TIMEOUT, PlatformError, body, check, download, http
from shared.channels.files import worth_fetching
from shared.channels.markdown import slack_mrkdwn
from shared.contracts import InboundMessage
from shared.settings import Settings

# Message subtypes a person sends with text for us: a message with a file, a thread reply also sent to
# the channel, /me. Every other subtype is an edit, a deletion, a join, a topic change, a bot's post...
USER_SUBTYPES = {"file_share", "thread_broadcast", "me_message"}
# Errors Slack reports with HTTP 200 and ok=false that go away on their own.
TRANSIENT = {"internal_error", "fatal_error", "service_unavailable", "request_timeout", "ratelimited"}
FILES_HOST = "files.slack.com"  # where files shared in Slack are downloaded from


class SlackChannel(BaseChannel):
    """A Slack app's bot user."""

    name: ClassVar[str] = "slack"
    max_chars: ClassVar[int] = 4000
    max_file_bytes: ClassVar[int] = 1_000_000_000  # Slack takes files of up to 1 GB
    required: ClassVar[tuple[str, ...]] = ("bot_token", "signing_secret")

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.cfg = settings.channels.slack
        secret = self.secret("signing_secret")
        self._verifier = SignatureVerifier(secret) if secret.strip() else None

    # ------------------------------------------------------------------ inbound

    def verify(self, headers: dict[str, str], body: bytes) -> None:
        """HMAC-SHA256 of v0:timestamp:body with the signing secret; timestamps over 5 minutes old fail."""
        ts, sig = headers.get("x-slack-request-timestamp", ""), headers.get("x-slack-signature", "")
        try:
            ok = self._verifier is not None and ts.isascii() and ts.isdigit() and self._verifier.is_valid(body, ts, sig)
        except (ValueError, TypeError):
            ok = False
        if not ok:
            raise WebhookError(401, "bad or stale X-Slack-Signature")

    def parse(self, headers: dict[str, str], body: bytes) -> Parsed:
        payload = json_object(body)
        kind = payload.get("type")
        if kind == "url_verification":
            return Parsed(response={"challenge": str(payload.get("challenge", ""))})
        if kind != "event_callback":
            return Parsed()
        event, event_id = payload.get("event"), payload.get("event_id")
        if not isinstance(event, dict) or not isinstance(event_id, str):
            raise WebhookError(400, "event_callback without event or event_id")
        inbound = self._inbound(event_id, event, _bot_user(payload))
        return Parsed(messages=[inbound] if inbound else [], event_id=event_id)

    def _inbound(self, event_id: str, event: dict[str, Any], bot_user: str | None) -> InboundMessage | None:
        subtype = event.get("subtype")
        if event.get("bot_id") or (subtype is not None and subtype not in USER_SUBTYPES):
            return None  # bots' posts (ours too: no loops), edits, deletions, joins
        mention = event.get("type") == "app_mention"
        if not (mention or (event.get("type") == "message" and event.get("channel_type") == "im")):
            return None  # channel messages also arrive as app_mention when they concern us
        text, channel, user, ts = event.get("text"), event.get("channel"), event.get("user"), event.get("ts")
        if not (isinstance(text, str) and isinstance(channel, str) and isinstance(user, str) and isinstance(ts, str)):
            raise WebhookError(400, "message event without text, channel, user or ts")
        dm, event_id = channel.startswith("D"), f"{channel}:{ts}"  # a DM's channel id starts with D
        media = _media(event.get("files"))
        if not text.strip():  # a file shared without a word: only in a DM; one that cannot be read is said so
            return InboundMessage(channel=self.name, chat_id=channel, sender_id=user, content="", event_id=event_id,
                                  unsupported="a file", media=media[0] if media else None, more_media=media[1:]) \
                if dm and subtype == "file_share" else None
        attached = [m for m in media if m["kind"] != "audio"]  # (a clip with words: the words alone)
        thread = event.get("thread_ts")
        if dm and not thread:  # a plain DM: the conversation is the DM itself
            session_key, reply_meta = f"slack:{channel}", {}
        else:  # a mention starts (or continues) a thread; each thread is its own session
            root = str(thread or ts)
            session_key, reply_meta = f"slack:{channel}:{root}", {"thread_ts": root}
        return InboundMessage(channel=self.name, chat_id=channel, sender_id=user, content=plain(_strip(text, bot_user)),
                              event_id=event_id, session_key=session_key, reply_meta=reply_meta, group=not dm,
                              media=attached[0] if attached else None, more_media=attached[1:])

    def fetch_media(self, media: dict[str, str], limit: int) -> tuple[bytes, str]:
        """The file's private download URL, with the bot token (the app needs the files:read scope). The
        token goes to Slack's own hosts only, whatever a URL says."""
        url, api = urlsplit(media["url"]), urlsplit(self.cfg.api_base)
        if (url.scheme, url.hostname) not in (("https", FILES_HOST), (api.scheme, api.hostname)):
            raise Rejected(f"slack file: not on {FILES_HOST}")
        auth = {"Authorization": f"Bearer {self.secret('bot_token')}"}
        return download(media["url"], limit=limit, what="slack file", headers=auth), media["name"]

    # ------------------------------------------------------------------ outbound

    def format(self, markdown: str) -> str:
        return slack_mrkdwn(markdown)

    def rate_limits(self, chat_id: str) -> list[Bucket]:
        """chat.postMessage: about one message per second per channel."""
        return [Bucket(f"slack:channel:{chat_id}", 1.0)]

    def send(self, chat_id: str, text: str, meta: dict[str, Any]) -> SendResult:
        data = self._call("chat.postMessage",
                          json={"channel": chat_id, "text": text, "unfurl_links": False, **_thread(meta)})
        return SendResult(str(data.get("ts") or "") or None)

    def send_file(self, chat_id: str, file: OutFile, meta: dict[str, Any]) -> SendResult:
        """Slack's external upload: files.getUploadURLExternal (the name and length) answers where the
        bytes go and the file's id; the bytes go there (without the token: the URL grants the upload);
        files.completeUploadExternal then shares the file in the chat, in the thread `send` answers in.
        A failure after the upload leaves that copy unshared, private to the bot: a retry uploads again."""
        slot = self._call("files.getUploadURLExternal", data={"filename": file.name, "length": str(len(file.data))})
        url, file_id = slot.get("upload_url"), slot.get("file_id")
        if not (isinstance(url, str) and url and isinstance(file_id, str) and file_id):
            raise PlatformError("slack files.getUploadURLExternal: no upload_url or file_id in the answer")
        # A large file takes a while to send: the download's patience, not a send's.
        check(http(DOWNLOAD_TIMEOUT).post(url, files={"file": (file.name, file.data, file.mime)}),
              what="slack file upload", handed_out=True)
        self._call("files.completeUploadExternal",
                   json={"files": [{"id": file_id, "title": file.name}], "channel_id": chat_id, **_thread(meta)})
        return SendResult(file_id)

    def _call(self, method: str, **request: Any) -> dict[str, Any]:
        """A Web API method, POSTed with the bot token. Slack answers its errors with HTTP 200 and
        ok=false: one that goes away on its own is retried (PlatformError), any other is Rejected."""
        response = http(self.settings.channels.delivery.send_timeout).post(
            f"{self.cfg.api_base.rstrip('/')}/{method}",
            headers={"Authorization": f"Bearer {self.secret('bot_token')}"}, **request,
        )
        check(response, what=f"slack {method}")
        data = body(response)
        if data.get("ok") is not True:
            error = str(data.get("error", "not ok"))
            if error in TRANSIENT:
                raise PlatformError(f"slack {method}: {error}")
            raise Rejected(f"slack {method}: {error}")
        return data


def _thread(meta: dict[str, Any]) -> dict[str, Any]:
    """The thread a reply goes into (reply_meta's thread_ts), as the request's field; {} outside one."""
    return {"thread_ts": meta["thread_ts"]} if meta.get("thread_ts") else {}


def _media(files: object) -> list[dict[str, str]]:
    """A message's photos (under MAX_IMAGE) and documents, MAX_IMAGES at most, for the worker to fetch,
    or else its first audio clip."""
    found: list[dict[str, str]] = []
    for f in files if isinstance(files, list) else []:
        if not (isinstance(f, dict) and isinstance(f.get("url_private_download"), str)):
            continue
        mime, size = str(f.get("mimetype", "")), f.get("size", 0)
        kind = "photo" if mime in IMAGE_TYPES and isinstance(size, int) and size <= MAX_IMAGE else \
            "audio" if mime.startswith("audio/") else "file" if worth_fetching(mime) else None
        if kind:
            found.append({"kind": kind, "id": str(f.get("id", "")), "url": f["url_private_download"],
                          "name": str(f.get("name") or "file")})
    return [m for m in found if m["kind"] != "audio"][:MAX_IMAGES] or found[:1]


def _bot_user(payload: dict[str, Any]) -> str | None:
    auths = payload.get("authorizations")
    if isinstance(auths, list) and auths and isinstance(auths[0], dict):
        user = auths[0].get("user_id")
        return user if isinstance(user, str) else None
    return None


def _strip(text: str, bot_user: str | None) -> str:
    """Drop the mention of the bot (the one at the start when we don't know our own id)."""
    pattern = rf"<@{re.escape(bot_user)}(\|[^>]*)?>\s*" if bot_user else r"^\s*<@[A-Z0-9]+(\|[^>]*)?>\s*"
    return re.sub(pattern, "", text).strip() or text


# Slack's markup in the text it sends: <@U1|name>, <#C1|general>, <!here>, <!subteam^S1|@team>, <url|label>
_MARKUP = re.compile(r"<([@#!]?)([^<>|]*)(?:\|([^<>]*))?>")
_SPECIAL = {"here", "channel", "everyone"}


def _readable(match: re.Match[str]) -> str:
    sigil, target, label = match.group(1), match.group(2), match.group(3)
    if sigil in ("@", "#"):
        return f"{sigil}{label or target}"
    if sigil == "!":
        return label or (f"@{target}" if target in _SPECIAL else target)
    if label is None:
        return target.removeprefix("mailto:")
    return label if label == re.sub(r"^(https?://|mailto:)", "", target) else f"{label} ({target})"


def plain(text: str) -> str:
    """A message's text as its sender wrote it: Slack escapes &, < and > and wraps links and mentions
    in <...>, which the model would otherwise read (and echo) as they are."""
    text = _MARKUP.sub(_readable, text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
