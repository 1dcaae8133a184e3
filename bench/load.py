"""An async HTTP load generator: closed loop (N clients back to back, for maximum throughput) and
open loop (requests sent on a fixed schedule whatever the answers, latency measured from the
scheduled time so a stall is not hidden: no coordinated omission)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from bench.report import pct

Request = Callable[[int], tuple[bytes, dict[str, str]]]  # i -> (body, headers)


@dataclass
class LoadResult:
    """What one load phase measured."""

    label: str
    duration: float
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: int = 0

    @property
    def ok(self) -> int:
        return sum(n for code, n in self.statuses.items() if 200 <= code < 300)

    @property
    def rps(self) -> float:
        return self.ok / self.duration if self.duration else 0.0

    def pct(self, p: float) -> float:
        return pct(self.latencies_ms, p)


async def _send(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
                result: LoadResult, started: float) -> None:
    try:
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
            result.statuses[response.status] += 1
    except (TimeoutError, aiohttp.ClientError):
        result.errors += 1
        return
    result.latencies_ms.append((time.perf_counter() - started) * 1000)


def _session(limit: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit, force_close=False),
                                 timeout=aiohttp.ClientTimeout(total=30))


async def closed_loop(url: str, make: Request, *, concurrency: int, duration: float, label: str,
                      first: int = 0) -> LoadResult:
    """`concurrency` clients, each sending its next request when the last one is answered."""
    result = LoadResult(label, duration)
    counter = iter(range(first, first + 10**9))
    async with _session(concurrency) as session:
        deadline = time.perf_counter() + duration

        async def client() -> None:
            while time.perf_counter() < deadline:
                body, headers = make(next(counter))
                await _send(session, url, body, headers, result, time.perf_counter())

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        result.duration = time.perf_counter() - began
    return result


async def open_loop(url: str, make: Request, *, rate: float, duration: float, label: str,
                    first: int = 0, limit: int = 512) -> LoadResult:
    """`rate` requests per second on a fixed schedule for `duration` seconds."""
    result = LoadResult(label, duration)
    total = int(rate * duration)
    tasks: list[asyncio.Task[None]] = []
    async with _session(limit) as session:
        began = time.perf_counter()
        for i in range(total):
            due = began + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body, headers = make(first + i)
            tasks.append(asyncio.create_task(_send(session, url, body, headers, result, due)))
        await asyncio.gather(*tasks)
    return result
