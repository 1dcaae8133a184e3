"""A closed-loop turn driver: keeps `target` turns in flight through the REST API (one turn per
idle conversation, so no message is folded into another's turn), at a series of levels, sampling
in-flight LLM calls and worker memory during each measurement window."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from sqlalchemy import Engine, text

from bench.stack import AUTH

SUBMITTERS = 64  # concurrent POSTs at most


@dataclass
class Level:
    """What one level measured."""

    target: int
    started: float  # time.time() of the window
    ended: float = 0.0
    turns: int = 0  # runs that finished successfully inside the window (from Postgres)
    failed: int = 0
    in_flight: list[float] = field(default_factory=list)  # LLM calls in flight, sampled
    mean_in_flight: float = 0.0  # LLM calls in flight, time-weighted over the window (from the fake LLM)
    outstanding: list[int] = field(default_factory=list)  # turns the client had in flight, sampled
    calls: int = 0  # LLM calls the fake received during the window
    rss: list[int] = field(default_factory=list)  # worker tree RSS bytes, sampled

    @property
    def rate(self) -> float:
        return self.turns / (self.ended - self.started) if self.ended > self.started else 0.0

    @property
    def call_rate(self) -> float:
        return self.calls / (self.ended - self.started) if self.ended > self.started else 0.0

    @property
    def sampled_in_flight(self) -> float:
        return sum(self.in_flight) / len(self.in_flight) if self.in_flight else 0.0

    @property
    def max_rss_mib(self) -> float:
        return max(self.rss, default=0) / 2**20


@dataclass
class Driver:
    gateway: str
    engine: Engine
    in_flight: Callable[[], float]  # e.g. the fake LLM's counter
    rss: Callable[[], int]
    calls: Callable[[], int] = lambda: 0  # LLM calls received so far (the fake LLM's count)
    open_between: Callable[[float, float], float] = lambda t0, t1: 0.0  # the fake LLM's mean_in_flight
    message: str = "hello"
    target: int = 0
    outstanding: dict[str, str] = field(default_factory=dict)  # run id -> conversation id
    free: list[str] = field(default_factory=list)
    posting: int = 0
    errors: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, levels: list[int], *, ramp: float, window: float,
                  saturated: Callable[[list[Level]], bool] | None = None, drain: float = 120.0) -> list[Level]:
        done: list[Level] = []
        async with aiohttp.ClientSession(self.gateway, headers=AUTH,
                                         connector=aiohttp.TCPConnector(limit=SUBMITTERS)) as http:
            tasks = [asyncio.create_task(self._feed(http)), asyncio.create_task(self._poll())]
            try:
                self.target = min(levels[0], 10)  # warm-up: imports, pools, litellm's first calls
                await asyncio.sleep(ramp)
                for target in levels:
                    self.target = target
                    await asyncio.sleep(ramp)
                    done.append(await self._window(target, window))
                    if saturated and saturated(done):
                        break
                self.target = 0
                deadline = time.monotonic() + drain
                while (self.outstanding or self.posting) and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(self._count, done)
        return done

    async def hold(self, n: int, *, timeout: float, drain: float = 120.0) -> tuple[float, int, float]:
        """Open `n` turns as fast as the gateway takes them; (peak LLM calls in flight, peak worker RSS
        bytes, seconds until the peak) while the LLM is slow enough that none finishes meanwhile."""
        peak, rss, at = 0.0, 0, 0.0
        began = time.monotonic()
        async with aiohttp.ClientSession(self.gateway, headers=AUTH,
                                         connector=aiohttp.TCPConnector(limit=SUBMITTERS)) as http:
            self.target = n
            tasks = [asyncio.create_task(self._feed(http)), asyncio.create_task(self._poll())]
            try:
                while time.monotonic() - began < timeout and peak < n:
                    now = self.in_flight()
                    if now > peak:
                        peak, at = now, time.monotonic() - began
                    rss = max(rss, await asyncio.to_thread(self.rss))
                    await asyncio.sleep(0.2)
                self.target = 0
                deadline = time.monotonic() + drain
                while (self.outstanding or self.posting) and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        return peak, rss, at

    async def _window(self, target: int, window: float) -> Level:
        level = Level(target, time.time())
        calls, began = self.calls(), time.monotonic()
        end = began + window
        while time.monotonic() < end:
            level.in_flight.append(self.in_flight())
            level.outstanding.append(len(self.outstanding) + self.posting)
            level.rss.append(await asyncio.to_thread(self.rss))
            await asyncio.sleep(0.2)
        level.ended = time.time()
        level.calls = self.calls() - calls
        level.mean_in_flight = self.open_between(began, time.monotonic())
        return level

    async def _feed(self, http: aiohttp.ClientSession) -> None:
        while True:
            need = self.target - len(self.outstanding) - self.posting
            for _ in range(max(0, min(need, SUBMITTERS - self.posting))):
                self.posting += 1
                task = asyncio.create_task(self._submit(http))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(0.01)

    async def _submit(self, http: aiohttp.ClientSession) -> None:
        try:
            cid = self.free.pop() if self.free else await self._conversation(http)
            async with http.post(f"/api/v1/conversations/{cid}/messages", json={"message": self.message}) as r:
                body = await r.json()
            if r.status == 202 and body.get("runId"):
                self.outstanding[body["runId"]] = cid
            else:
                self.errors += 1
        except (TimeoutError, aiohttp.ClientError, ValueError):
            self.errors += 1
            await asyncio.sleep(0.1)
        finally:
            self.posting -= 1

    async def _conversation(self, http: aiohttp.ClientSession) -> str:
        async with http.post("/api/v1/conversations") as r:
            return str((await r.json())["conversationId"])

    async def _poll(self) -> None:
        while True:
            ids = list(self.outstanding)
            if ids:
                for run_id in await asyncio.to_thread(self._finished, ids):
                    self.free.append(self.outstanding.pop(run_id))
            await asyncio.sleep(0.2)

    def _finished(self, ids: list[str]) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.execute(text("select id from runs where id = any(:ids) and status in "
                                          "('succeeded', 'failed', 'cancelled')"), {"ids": ids}).scalars())

    def _count(self, levels: list[Level]) -> None:
        with self.engine.connect() as conn:
            for level in levels:
                rows: dict[str, int] = dict(conn.execute(text(
                    "select status, count(*) from runs where finished_at >= to_timestamp(:a) "
                    "and finished_at < to_timestamp(:b) group by status"), {"a": level.started, "b": level.ended}
                ).all())
                level.turns = int(rows.get("succeeded", 0))
                level.failed = int(sum(n for status, n in rows.items() if status != "succeeded"))
