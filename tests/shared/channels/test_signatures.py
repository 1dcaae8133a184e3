"""Signature guards, property-tested: a correctly signed request passes; any change to its body,
timestamp or signature is refused with 401, for every platform."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.channels.base import Channel, WebhookError
from shared.channels.discord import DiscordChannel
from shared.channels.feishu import FeishuChannel
from shared.channels.signing import fresh
from shared.channels.slack import SlackChannel
from shared.channels.telegram import TelegramChannel
from shared.channels.webhook import WebhookChannel
from shared.channels.whatsapp import WhatsAppChannel
from shared.settings import Settings
from tests.fakes.discord import FakeDiscord
from tests.fakes.feishu import FakeFeishu
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.fakes.webhook import FakeWebhookReceiver
from tests.fakes.whatsapp import FakeWhatsApp

Sign = Callable[[dict[str, Any]], tuple[bytes, dict[str, str]]]


def _platforms() -> dict[str, tuple[Channel, Sign, str | None, str]]:
    """name -> (channel, how the platform signs, timestamp header, signature header)."""
    tg, sl = FakeTelegram("1:t", "tg-secret"), FakeSlack("xoxb-1", "slack-secret")
    wa, fs = FakeWhatsApp("wa-token", "wa-secret", "P1"), FakeFeishu("cli", "s", "verify-tok", "enc-key")
    dc, wh = FakeDiscord("APP", "bot"), FakeWebhookReceiver("wh-secret")
    s = Settings(channels={
        "telegram": {"token": "1:t", "webhook_secret": tg.secret},
        "slack": {"bot_token": "xoxb-1", "signing_secret": sl.signing_secret},
        "whatsapp": {"access_token": "x", "app_secret": wa.app_secret, "verify_token": "v", "phone_number_id": "P1"},
        "feishu": {"app_id": "cli", "app_secret": "s", "verification_token": fs.verification_token,
                   "encrypt_key": fs.encrypt_key},
        "discord": {"application_id": "APP", "public_key": dc.public_key},
        "webhook": {"secret": wh.secret, "callback_url": "http://127.0.0.1:9/cb"},
    })
    return {
        "telegram": (TelegramChannel(s), tg.signed, None, "x-telegram-bot-api-secret-token"),
        "slack": (SlackChannel(s), sl.signed, "x-slack-request-timestamp", "x-slack-signature"),
        "whatsapp": (WhatsAppChannel(s), wa.signed, None, "x-hub-signature-256"),
        "feishu": (FeishuChannel(s), fs.signed, "x-lark-request-timestamp", "x-lark-signature"),
        "discord": (DiscordChannel(s), dc.signed, "x-signature-timestamp", "x-signature-ed25519"),
        "webhook": (WebhookChannel(s), wh.signed, "x-nanofleet-timestamp", "x-nanofleet-signature"),
    }


PLATFORMS = _platforms()
EVENT = {"header": {"token": "verify-tok", "event_id": "e1"}, "event": {}, "id": "1", "type": 2}
payloads = st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=20)), max_size=4).map(
    lambda extra: {**extra, **EVENT})


def signed(name: str, payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    raw, headers = PLATFORMS[name][1](payload)
    return raw, {k.lower(): v for k, v in headers.items()}


def refused(name: str, raw: bytes, headers: dict[str, str]) -> bool:
    try:
        PLATFORMS[name][0].verify(headers, raw)
    except WebhookError as err:
        assert err.status_code == 401
        return True
    return False


@pytest.mark.parametrize("name", list(PLATFORMS))
@settings(max_examples=60, deadline=None)
@given(payload=payloads, data=st.data())
def test_any_change_to_a_signed_request_is_refused(name: str, payload: dict[str, Any], data: st.DataObject) -> None:
    raw, headers = signed(name, payload)
    assert not refused(name, raw, headers)
    if name != "telegram":  # Telegram sends a static secret token, it does not sign the body
        other_body = data.draw(st.binary(max_size=200).filter(lambda b: b != raw), label="body")
        assert refused(name, other_body, headers)
    _, ts_header, sig_header = PLATFORMS[name][1:]
    other_sig = data.draw(st.text(max_size=80).filter(lambda s: s != headers[sig_header]), label="signature")
    assert refused(name, raw, {**headers, sig_header: other_sig})
    assert refused(name, raw, {k: v for k, v in headers.items() if k != sig_header})
    if ts_header:
        other_ts = data.draw(st.text(max_size=12).filter(lambda s: s != headers[ts_header]), label="timestamp")
        assert refused(name, raw, {**headers, ts_header: other_ts})


@pytest.mark.parametrize("name", ["slack", "feishu", "discord", "webhook"])
@settings(max_examples=20, deadline=None)
@given(payload=payloads, age=st.integers(301, 10**6), sign=st.sampled_from([-1, 1]))
def test_a_stale_timestamp_is_refused_even_when_signed(name: str, payload: dict[str, Any], age: int, sign: int) -> None:
    fake_sign = PLATFORMS[name][1]
    raw, headers = fake_sign.__self__.signed(payload, timestamp=int(time.time()) - sign * age)  # type: ignore[attr-defined]
    assert refused(name, raw, {k.lower(): v for k, v in headers.items()})


@given(ts=st.text(max_size=14))
def test_only_plain_digit_timestamps_are_fresh(ts: str) -> None:
    now = 1_700_000_000.0
    assert fresh(ts, now=now) == (ts.isascii() and ts.isdigit() and len(ts) <= 12 and abs(now - int(ts)) <= 300)


def test_feishu_url_verification_needs_no_signature_but_everything_else_does() -> None:
    fs = FakeFeishu("cli", "s", "verify-tok", "enc-key")
    challenge = {"type": "url_verification", "challenge": "c", "token": "verify-tok"}
    raw, headers = fs.signed(challenge, signed=False)
    PLATFORMS["feishu"][0].verify({k.lower(): v for k, v in headers.items()}, raw)
    raw, headers = fs.signed(EVENT, signed=False)
    assert refused("feishu", raw, {k.lower(): v for k, v in headers.items()})
    assert refused("feishu", json.dumps(challenge).encode(), {})  # not encrypted while a key is set
