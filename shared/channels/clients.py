"""What the platform modules share: one pooled HTTP client and one Redis client per process, the
mapping of platform HTTP answers to RateLimited (429), Rejected (other 4xx) or a retry (5xx), and
what a platform is asked about its bot once (Learned)."""

from __future__ import annotations

import logging
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
    """A keep-alive client for every send in this process (thread-safe)."""
    return httpx.Client(
        timeout=httpx.Timeout(timeout, connect=min(5.0, timeout)),
        limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
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


def check(response: httpx.Response, *, what: str, wait: float | None = None) -> None:
    """Raise for an unsuccessful answer: RateLimited, Rejected, or PlatformError (retried). Messages
    never carry the URL: Telegram's holds the bot token."""
    status = response.status_code
    if status < 400:
        return
    if status == 429:
        raise RateLimited(wait if wait is not None else retry_after(response))
    if status < 500 and status not in RETRYABLE_4XX:
        raise Rejected(f"{what}: HTTP {status}: {response.text[:300]}", status)
    raise PlatformError(f"{what}: HTTP {status}: {response.text[:300]}")


def download(url: str, *, limit: int, what: str, headers: dict[str, str] | None = None) -> bytes:
    """A file from the platform, read as it comes and refused (Rejected) past `limit` bytes. Errors
    name `what`, never the URL (Telegram's holds the bot token)."""
    with http(DOWNLOAD_TIMEOUT).stream("GET", url, headers=headers) as response:
        if response.status_code >= 400:
            response.read()
            check(response, what=what)
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

