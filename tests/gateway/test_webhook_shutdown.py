"""A Discord interaction is answered by its deadline even while its event is still being recorded
(Discord never sends it again); a gateway told to stop meanwhile records it, with its message, before
it exits."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import text
from sqlmodel import Session

from shared.db import get_engine
from tests.fakes.discord import FakeDiscord
from tests.support.processes import wait_until
from tests.support.stack import Stack, gateway_process


def _count(database_url: str, sql: str, **params: str) -> int:
    with get_engine(database_url).connect() as conn:
        return int(conn.execute(text(sql), params).scalar() or 0)


def test_a_message_answered_before_it_was_stored_is_stored_before_the_gateway_exits(
    make_stack: Callable[..., Stack], database_url: str
) -> None:
    discord = FakeDiscord("APP1", "discord-bot-token")
    discord.start()
    try:
        s = make_stack(CHANNELS__DISCORD__APPLICATION_ID=discord.application_id,
                       CHANNELS__DISCORD__PUBLIC_KEY=discord.public_key, CHANNELS__DISCORD__BOT_TOKEN=discord.bot_token,
                       CHANNELS__DISCORD__API_BASE=discord.url, CHANNELS__DISCORD__ALLOW_FROM=json.dumps(["1001"]))
        said = f"stored-at-shutdown-{uuid.uuid4().hex[:8]}"
        body, headers = discord.signed(discord.command(channel="100000000000000001", user="1001", text=said,
                                                       interaction_id=uuid.uuid4().hex))
        with gateway_process(s) as (proc, client), ThreadPoolExecutor(1) as pool, \
                Session(get_engine(database_url)) as locker:
            locker.execute(text("lock table inbound_events in exclusive mode"))  # the ledger write waits on it
            try:
                answer = pool.submit(client.post, "/webhooks/discord", content=body, headers=headers).result(20)
                assert answer.status_code == 200 and answer.json() == {"type": 5}, answer.text
                os.killpg(proc.pid, signal.SIGTERM)  # a deploy, while the message is not stored yet
                wait_until(lambda: not proc.alive() or "webhook events still to be recorded" in proc.log(),
                           timeout=30, message="the gateway to stop, or to say it waits for the write")
            finally:
                locker.commit()
            assert proc.popen.wait(30) in (0, -signal.SIGTERM), proc.log()
        assert _count(database_url, "select count(*) from inbound_events where message->>'content' like :m",
                      m=f"%{said}%") == 1  # for a worker to submit
    finally:
        discord.server.should_exit = True
        discord.server.stop()
