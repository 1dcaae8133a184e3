"""Signature helpers shared by the platform modules: constant-time comparison, HMAC, freshness."""

from __future__ import annotations

import hashlib
import hmac
import time

MAX_AGE = 300.0  # seconds a signed timestamp stays valid (Slack's rule, applied to every platform)


def same(given: str, expected: str) -> bool:
    """Constant-time equality that is simply False for odd input (non-ASCII headers, empty secrets)."""
    if not expected:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8"))


def hmac_hex(secret: str, data: bytes) -> str:
    return hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


def fresh(timestamp: str, *, now: float | None = None, max_age: float = MAX_AGE) -> bool:
    """A Unix timestamp in seconds (digits only) within `max_age` of now, either way."""
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        return False
    return abs((time.time() if now is None else now) - int(timestamp)) <= max_age
