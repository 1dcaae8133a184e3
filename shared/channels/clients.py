"""What the platform modules share: one pooled HTTP client and one Redis client per process, the
mapping of platform HTTP answers to success (2xx only), RateLimited (429), Rejected (a redirect, another
4xx) or a retry (5xx), and what a platform is asked about its bot once (Learned)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

import httpx
import redis

from shared.channels.base import RateLimited, Rejected, WebhookError

log = logging.getLogger(__name__)

RETRYABLE_4XX = (408, 409, 425)
# The setting (NANOFLEET_CHANNELS__<PLATFORM>__...) the URLs of a platform's calls start with, which a redirect's
# error names; the first word of a call's `what` is its platform (a URL the platform handed out has none)
URL_SETTINGS = {"telegram": "API_BASE", "slack": "API_BASE", "whatsapp": "API_BASE", "feishu": "API_BASE",
                "discord": "API_BASE", "webhook": "CALLBACK_URL"}
# A path segment this long may be a secret (Telegram's bot token, Discord's interaction token): a redirect's
# error shows it as "…".
LONG_SEGMENT = re.compile(r"[^/]{24,}")
DOWNLOAD_TIMEOUT = 60.0  # seconds without a byte from the platform before a download gives up
# False while the gateway parses a webhook on its event loop, where asking the platform would block
# every request: Learned then raises MustAsk, and the gateway parses that event again in a thread.
may_ask: ContextVar[bool] = ContextVar("may_ask", default=True)


class MustAsk(Exception):
    """Parsing needs something only the platform can tell, and may not ask it here (see may_ask)."""


class PlatformError(Exception):
    """The platform failed in a way that may pass (5xx, a transient error code): try again later."""


@lru_cache(maxsize=4)
def http(timeout: float = 10.0) -> httpx.Client:
    """A keep-alive client for every send in this process (thread-safe). It never follows a redirect: a
    POST sent on to wherever a Location says could go to anyone, and one not followed is no delivery
    (check() refuses it)."""
    return httpx.Client(
        timeout=httpx.Timeout(timeout, connect=min(5.0, timeout)),
        limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
        follow_redirects=False,
    )


@lru_cache(maxsize=4)
def redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, max_connections=50, health_check_interval=30)


def retry_after(response: httpx.Response, default: float = 1.0) -> float:
    """Seconds from a Retry-After header (seconds form), else `default`."""
    try:
        return max(0.0, float(response.headers.get("retry-after", default)))
    except ValueError:
        return default


def body(response: httpx.Response) -> dict[str, Any]:
    """The JSON object a platform answered, or {} when it is not one."""
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def check(response: httpx.Response, *, what: str, wait: float | None = None, see_other: bool = False,
          handed_out: bool = False) -> None:
    """Raise for any answer but a 2xx (or, with `see_other`, a 303: how a receiver of ours says it
    took a POST, and where to look): RateLimited, Rejected (a redirect, which is not followed, is no
    delivery; its error names the setting the URL came from, unless the platform `handed_out` the URL),
    or PlatformError (retried). Messages never carry the request's URL: Telegram's holds the bot token."""
    status = response.status_code
    if response.is_success or (see_other and status == 303):
        return
    if 300 <= status < 400:
        raise Rejected(redirected(response, what=what, setting=None if handed_out else _url_setting(what)), status)
    if status == 429:
        raise RateLimited(wait if wait is not None else retry_after(response))
    if status < 500 and status not in RETRYABLE_4XX:
        raise Rejected(f"{what}: HTTP {status}: {response.text[:300]}", status)
    raise PlatformError(f"{what}: HTTP {status}: {response.text[:300]}")


def redirected(response: httpx.Response, *, what: str, setting: str | None) -> str:
    """Why a redirect is refused: where it points, and the setting to give that URL in, where one names it."""
    status, location = response.status_code, _location(response)
    if not location:
        return f"{what}: HTTP {status}: a redirect without a Location; the URL called is not the final one"
    fix = f"set the final URL in {setting}" if setting else "the URL called is not the final one"
    return f"{what}: HTTP {status}: redirected to {location}: {fix}"


def _url_setting(what: str) -> str | None:
    """The setting the URL of the call `what` came from (its first word names the platform)."""
    platform = what.split(" ", 1)[0]
    if platform not in URL_SETTINGS:
        return None
    return f"NANOFLEET_CHANNELS__{platform.upper()}__{URL_SETTINGS[platform]}"


def _location(response: httpx.Response) -> str:
    """A redirect's Location, made absolute, without its query (a signed URL's key), user or fragment, and
    with each long path segment (a token, in Telegram's or Discord's URLs) shown as "…"."""
    raw = response.headers.get("location", "").strip()
    if not raw:
        return ""
    try:
        url = response.request.url.join(raw)
    except RuntimeError:  # a response made without its request: the Location as it is
        url = httpx.URL(raw)
    except httpx.InvalidURL:
        return "a Location that is no URL"
    origin = f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}" if url.is_absolute_url else ""
    return origin + LONG_SEGMENT.sub("…", url.path) + ("?…" if url.query else "")


def download(url: str, *, limit: int, what: str, headers: dict[str, str] | None = None) -> bytes:
    """A file from the platform, read as it comes and refused (Rejected) past `limit` bytes. Errors
    name `what`, never the URL (Telegram's holds the bot token)."""
    with http(DOWNLOAD_TIMEOUT).stream("GET", url, headers=headers) as response:
        if not response.is_success:
            response.read()
            check(response, what=what, handed_out=True)
        data = bytearray()
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) > limit:
                raise Rejected(f"{what}: the file is over {limit:,} bytes")
        return bytes(data)


class Learned:
    """A fact about the bot its platform is asked once, then remembered (Telegram's username,
    Feishu's open_id): a group message cannot be judged without it. While the platform does not
    answer, the event is refused (503) for the platform to send again, and the platform is not
    asked again for `pause` seconds (each event would wait on it)."""

    def __init__(self, what: str, ask: Callable[[], object], *, pause: float, hint: str = "") -> None:
        self.what, self._ask, self.pause, self.hint = what, ask, pause, hint
        self.value = ""
        self._ask_again_at = 0.0  # time.monotonic()

    def get(self, *, ask: bool = True) -> str:
        """The value; with ask=False, "" until it is known."""
        if self.value or not ask:
            return self.value
        if not may_ask.get():
            raise MustAsk(self.what)
        unknown = WebhookError(503, f"could not learn {self.what}; try again")
        if time.monotonic() < self._ask_again_at:
            raise unknown
        try:
            value = self._ask()
        except (httpx.HTTPError, PlatformError, RateLimited, Rejected) as err:
            self._ask_again_at = time.monotonic() + self.pause
            log.warning("could not learn %s%s: %s: %s", self.what, self.hint, type(err).__name__, err)
            raise unknown from None
        if not isinstance(value, str) or not value:
            raise WebhookError(503, f"the answer gave no {self.what}")
        self.value = value
        return value

