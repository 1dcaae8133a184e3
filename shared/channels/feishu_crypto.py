"""Feishu's encrypted event bodies: AES-256-CBC decryption with the app's encrypt key, the
X-Lark-Signature over the raw body, and a clear refusal of an encrypted body when no key is set."""

from __future__ import annotations

import base64
import hashlib
import logging
import time
from typing import Any

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from shared.channels.base import WebhookError, json_object
from shared.channels.signing import fresh, same

log = logging.getLogger(__name__)
NO_KEY = ("the event is encrypted: set NANOFLEET_CHANNELS__FEISHU__ENCRYPT_KEY to the Encrypt Key of the app's "
          "Event Subscriptions")
WARN_EVERY = 60.0  # seconds between warnings of it: Feishu sends each event again, and every one fails alike
_warned_at: float | None = None  # time.monotonic() of the last


class EncryptedWithoutKey(WebhookError):
    """An encrypted event while no encrypt key is set: the operator's to fix, so the answer names the
    setting (401, as a body that is not encrypted while a key is set) rather than the verification
    token, which is inside the ciphertext and may well be right."""

    def __init__(self) -> None:
        super().__init__(401, NO_KEY)


def decrypt(encrypted: str, key: str) -> bytes:
    """Feishu's scheme: AES-256-CBC, key sha256(encrypt key), IV the first 16 bytes, PKCS#7."""
    raw = base64.b64decode(encrypted, validate=True)
    if len(raw) < 32 or len(raw) % 16:
        raise ValueError("bad ciphertext length")
    decryptor = Cipher(algorithms.AES(hashlib.sha256(key.encode()).digest()), modes.CBC(raw[:16])).decryptor()
    padded = decryptor.update(raw[16:]) + decryptor.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    return unpadder.update(padded) + unpadder.finalize()


def opened(body: bytes, key: str) -> dict[str, Any]:
    """The event as JSON, decrypted with `key` when one is set (then it must be encrypted)."""
    payload = json_object(body)
    encrypted = payload.get("encrypt")
    if not key:
        if isinstance(encrypted, str):
            raise _encrypted_without_key()
        return payload
    if not isinstance(encrypted, str):
        raise WebhookError(401, "body is not encrypted with the encrypt key")
    try:
        return json_object(decrypt(encrypted, key))
    except (ValueError, WebhookError):
        raise WebhookError(401, "body does not decrypt with the encrypt key") from None


def check_signature(headers: dict[str, str], body: bytes, key: str) -> None:
    """X-Lark-Signature: sha256 of timestamp + nonce + encrypt key + raw body, with a fresh timestamp."""
    ts, nonce = headers.get("x-lark-request-timestamp", ""), headers.get("x-lark-request-nonce", "")
    expected = hashlib.sha256((ts + nonce + key).encode("utf-8", "surrogateescape") + body).hexdigest()
    if not (fresh(ts) and same(headers.get("x-lark-signature", ""), expected)):
        raise WebhookError(401, "bad or stale X-Lark-Signature")


def _encrypted_without_key() -> EncryptedWithoutKey:
    """The refusal, logged at most once a minute per process."""
    global _warned_at
    now = time.monotonic()
    if _warned_at is None or now - _warned_at >= WARN_EVERY:
        _warned_at = now
        log.warning("feishu: %s", NO_KEY)
    return EncryptedWithoutKey()
