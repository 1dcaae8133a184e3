"""The chaos run's inbound traffic, in a background thread: each Telegram update delivered 3 times
(each delivery retried until the gateway answers 2xx, as Telegram does), or, without the webhook
route, each message posted once through the REST API (a failed post is re-sent only after checking
that the gateway did not store it)."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from dataclasses import dataclass, field

import aiohttp

from bench.chaos_check import action_of, message_text
from bench.fakes import telegram_update
from bench.stack import AUTH, TELEGRAM_SECRET

GIVE_UP = 300.0  # seconds a delivery keeps retrying


@dataclass
class Traffic:
    """What the client did: counts shared with the controller thread."""

    n: int
    chats: int
    deliveries: int
    seconds: float  # spread the first deliveries over this long
    telegram: bool
    gateway: str
    sent: int = 0  # requests answered 2xx
    failed_attempts: int = 0  # requests that got no 2xx (retried)
    abandoned: list[int] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    conversations: dict[int, str] = field(default_factory=dict)  # REST mode: chat -> conversation

    def chat(self, i: int) -> int:
        return 9_000_000 + i % self.chats

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="chaos-traffic", daemon=True)
        thread.start()
        return thread

    async def _run(self) -> None:
        try:
            async with aiohttp.ClientSession(self.gateway, timeout=aiohttp.ClientTimeout(total=15)) as http:
                began = time.monotonic()
                jobs = []
                for i in range(self.n):
                    first = began + i * self.seconds / self.n
                    if self.telegram:
                        offsets = [0.0, random.uniform(0.05, 2.0), random.uniform(2.0, 15.0)][: self.deliveries]
                        jobs += [self._telegram(http, i, first + o) for o in offsets]
                    else:
                        jobs.append(self._rest(http, i, first))
                await asyncio.gather(*jobs)
        finally:
            self.done.set()

    async def _until(self, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.monotonic()))

    async def _telegram(self, http: aiohttp.ClientSession, i: int, at: float) -> None:
        await self._until(at)
        body = json.dumps(telegram_update(30_000_000 + i, self.chat(i), message_text(i, action_of(i))))
        headers = {"content-type": "application/json", "x-telegram-bot-api-secret-token": TELEGRAM_SECRET}
        if not await self._retry(http, "/webhooks/telegram", body, headers):
            self.abandoned.append(i)

    async def _retry(self, http: aiohttp.ClientSession, path: str, body: str, headers: dict[str, str]) -> bool:
        deadline, wait = time.monotonic() + GIVE_UP, 0.2
        while time.monotonic() < deadline:
            if await self._post(http, path, body, headers):
                return True
            await asyncio.sleep(wait)
            wait = min(wait * 2, 3.0)
        return False

    async def _post(self, http: aiohttp.ClientSession, path: str, body: str, headers: dict[str, str]) -> bool:
        try:
            async with http.post(path, data=body, headers=headers) as r:
                await r.read()
                if 200 <= r.status < 300:
                    self.sent += 1
                    return True
        except (aiohttp.ClientError, TimeoutError):
            pass
        self.failed_attempts += 1
        return False

    async def _conversation(self, http: aiohttp.ClientSession, chat: int) -> str:
        while chat not in self.conversations:
            try:
                async with http.post("/api/v1/conversations", headers=AUTH) as r:
                    if r.status == 200:
                        self.conversations.setdefault(chat, (await r.json())["conversationId"])
                        break
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.5)
        return self.conversations[chat]

    async def _rest(self, http: aiohttp.ClientSession, i: int, at: float) -> None:
        await self._until(at)
        cid = await self._conversation(http, self.chat(i))
        content = message_text(i, action_of(i))
        body = json.dumps({"message": content})
        headers = {**AUTH, "content-type": "application/json"}
        deadline, wait = time.monotonic() + GIVE_UP, 0.2
        while time.monotonic() < deadline:
            if await self._post(http, f"/api/v1/conversations/{cid}/messages", body, headers):
                return
            await asyncio.sleep(wait)
            wait = min(wait * 2, 3.0)
            if await self._stored(http, cid, content):  # it went through; only the answer was lost
                return
        self.abandoned.append(i)

    async def _stored(self, http: aiohttp.ClientSession, cid: str, content: str) -> bool:
        try:
            async with http.get(f"/api/v1/conversations/{cid}/messages", params={"limit": "1000"},
                                headers=AUTH) as r:
                return r.status == 200 and any(m["content"] == content for m in await r.json())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
