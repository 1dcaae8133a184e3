"""`nanofleet channels ...` against the fake platforms: Telegram's set-webhook, Discord's register."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from shared.agent.service import COMMANDS, HELP
from tests.fakes.discord import FakeDiscord
from tests.fakes.server import free_port
from tests.fakes.telegram import FakeTelegram
from tests.support.processes import ROOT


@pytest.fixture(scope="module")
def telegram() -> Iterator[FakeTelegram]:
    fake = FakeTelegram("123456:cli-token", "cli-secret_1")
    fake.start()
    yield fake
    fake.server.stop()


def nanofleet(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NANOFLEET_")}
    return subprocess.run([sys.executable, "-m", "gateway.cli", "channels", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**base, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **env})


def test_set_webhook_registers_the_url_with_the_secret(telegram: FakeTelegram) -> None:
    env = {"NANOFLEET_CHANNELS__TELEGRAM__TOKEN": telegram.token,
           "NANOFLEET_CHANNELS__TELEGRAM__WEBHOOK_SECRET": telegram.secret,
           "NANOFLEET_CHANNELS__TELEGRAM__API_BASE": telegram.url}
    done = nanofleet("telegram", "set-webhook", "https://bot.example.com/webhooks/telegram", **env)
    assert done.returncode == 0, done.stderr
    assert "Webhook was set" in done.stdout
    assert telegram.webhook["url"] == "https://bot.example.com/webhooks/telegram"
    assert telegram.webhook["secret_token"] == telegram.secret
    assert [c["command"] for c in telegram.commands] == list(COMMANDS)  # the menu of in-chat commands
    assert "menu: /new /stop" in done.stdout
    assert telegram.refused == []
    refused = nanofleet("telegram", "set-webhook", "http://insecure.example.com/hook", **env)
    assert refused.returncode == 2 and "https://" in refused.stderr


def test_set_webhook_names_what_is_missing() -> None:
    done = nanofleet("telegram", "set-webhook", "https://x.example.com/webhooks/telegram",
                     NANOFLEET_CHANNELS__TELEGRAM__TOKEN="1:t")
    assert done.returncode == 2
    assert "NANOFLEET_CHANNELS__TELEGRAM__WEBHOOK_SECRET" in done.stderr and "Traceback" not in done.stderr


def test_set_webhook_that_cannot_reach_telegram_says_where_it_tried() -> None:
    """Offline it said only "[Errno 111] Connection refused" (helper's walkthrough)."""
    base = f"http://127.0.0.1:{free_port()}"
    done = nanofleet("telegram", "set-webhook", "https://x.example.com/webhooks/telegram",
                     NANOFLEET_CHANNELS__TELEGRAM__TOKEN="1:secret-token",
                     NANOFLEET_CHANNELS__TELEGRAM__WEBHOOK_SECRET="s", NANOFLEET_CHANNELS__TELEGRAM__API_BASE=base)
    assert done.returncode == 1 and f"the Bot API at {base}" in done.stderr, done.stderr
    assert "secret-token" not in done.stderr and "Traceback" not in done.stderr


def test_discord_register_creates_then_updates_the_ask_command() -> None:
    fake = FakeDiscord("APP9", "cli-bot-token")
    fake.start()
    try:
        env = {"NANOFLEET_CHANNELS__DISCORD__APPLICATION_ID": "APP9",
               "NANOFLEET_CHANNELS__DISCORD__PUBLIC_KEY": fake.public_key,
               "NANOFLEET_CHANNELS__DISCORD__API_BASE": fake.url}
        missing = nanofleet("discord", "register", **env)
        assert missing.returncode == 2 and "NANOFLEET_CHANNELS__DISCORD__BOT_TOKEN" in missing.stderr
        env["NANOFLEET_CHANNELS__DISCORD__BOT_TOKEN"] = fake.bot_token
        first, again = nanofleet("discord", "register", **env), nanofleet("discord", "register", **env)
        assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
        command = fake.commands["ask"]
        assert f"(command {command['id']})" in first.stdout and f"(command {command['id']})" in again.stdout
        assert [(o["name"], o["type"]) for o in command["options"]] == [("question", 3), ("file", 11)]
        assert [c.status for c in fake.calls if c.op == "command"] == [201, 200] and fake.refused == []
        wrong = nanofleet("discord", "register", **{**env, "NANOFLEET_CHANNELS__DISCORD__BOT_TOKEN": "nope-token"})
        assert wrong.returncode == 1 and "Discord API at" in wrong.stderr and "nope-token" not in wrong.stderr
    finally:
        fake.server.stop()


def test_the_command_menu_lists_what_help_explains() -> None:
    assert sorted(COMMANDS) == sorted(line.split()[0][1:] for line in HELP.splitlines()[1:])
