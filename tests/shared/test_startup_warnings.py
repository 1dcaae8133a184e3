"""Start-up warnings: a platform with some of its credentials set but not all is named with what is
missing when the gateway starts and when a worker starts working (not only by a 404 later)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from gateway.app import create_app
from shared.settings import load_settings
from shared.startup_checks import half_configured
from tests.support.processes import wait_until
from tests.support.stack import Stack

TG = "NANOFLEET_CHANNELS__TELEGRAM__"
SLACK = "NANOFLEET_CHANNELS__SLACK__"


def warnings_at_gateway_start(caplog: pytest.LogCaptureFixture, **channels: Any) -> list[str]:
    settings = load_settings(redis_url="redis://127.0.0.1:1/0", channels=channels)
    with caplog.at_level(logging.WARNING):
        create_app(settings)
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_half_configured_platforms_are_named_with_what_is_missing(caplog: pytest.LogCaptureFixture) -> None:
    warnings = warnings_at_gateway_start(caplog, telegram={"token": "123:abc"}, slack={"signing_secret": "s3cret"},
                                         whatsapp={"phone_number_id": "42"})
    assert len(warnings) == 3, warnings
    telegram, slack, whatsapp = sorted(warnings, key=lambda w: ["telegram", "slack", "whatsapp"].index(w.split()[0]))
    assert f"{TG}WEBHOOK_SECRET" in telegram and f"{TG}TOKEN" not in telegram
    assert f"{SLACK}BOT_TOKEN" in slack and f"{SLACK}SIGNING_SECRET" not in slack
    assert all(f"NANOFLEET_CHANNELS__WHATSAPP__{f}" in whatsapp for f in ("ACCESS_TOKEN", "APP_SECRET", "VERIFY_TOKEN"))


def test_platforms_left_unset_or_fully_set_start_quietly(caplog: pytest.LogCaptureFixture) -> None:
    full = {"telegram": {"token": "123:abc", "webhook_secret": "tg-secret"},
            "slack": {"api_base": "http://127.0.0.1:9", "allow_from": ["*"]}}  # no credentials: simply off
    assert warnings_at_gateway_start(caplog, **full) == []
    assert half_configured(load_settings(channels=full)) == {}


def test_a_worker_names_a_half_configured_platform(make_stack: Callable[..., Stack]) -> None:
    s = make_stack(CHANNELS__TELEGRAM__TOKEN="123456:only-the-token")
    worker = s.worker()
    s.beat()  # its sweep is the worker's first task, which builds the worker's runtime
    wait_until(lambda: f"{TG}WEBHOOK_SECRET" in worker.log(), timeout=60, message="the worker's warning")
    line = next(x for x in worker.log().splitlines() if f"{TG}WEBHOOK_SECRET" in x)
    assert '"level": "WARNING"' in line and "telegram is off" in line and "only-the-token" not in line
