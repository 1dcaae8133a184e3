"""Item 1: webhook ack latency and throughput on the Telegram path (verify, dedupe, persist,
enqueue) against a bare FastAPI endpoint under the same uvicorn setup. No worker consumes the
queue meanwhile, so the figures are the gateway's alone."""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
from sqlalchemy import text

from bench import plots
from bench.config import Config
from bench.context import Ctx
from bench.fakes import telegram_update
from bench.load import LoadResult, closed_loop, open_loop
from bench.report import Figure, ms
from bench.services import free_port
from bench.stack import TELEGRAM_SECRET, BenchStack
from tests.support.processes import Proc, wait_until

P99_TARGET_MS = 20.0
RATIO_TARGET = 0.5
CHATS = 1000


def _telegram_request(i: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(telegram_update(10_000_000 + i, 5_000_000 + i % CHATS, f"hello {i}")).encode()
    return body, {"content-type": "application/json", "x-telegram-bot-api-secret-token": TELEGRAM_SECRET}


def _start_bare(stack: BenchStack, workers: int) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc([sys.executable, "-m", "bench.bare", str(port), str(workers)], stack.env,
                stack.log_dir / f"bare-{workers}.log")
    stack.procs.append(proc)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=30, interval=0.1, message="the bare endpoint")
    return proc, url + "/webhooks/telegram"


def _merge(label: str, parts: list[LoadResult]) -> LoadResult:
    merged = LoadResult(label, sum(p.duration for p in parts))
    for p in parts:
        merged.latencies_ms += p.latencies_ms
        merged.statuses.update(p.statuses)
        merged.errors += p.errors
    return merged


async def _measure(cfg: Config, bare_url: str, tg_url: str) -> dict[str, LoadResult]:
    c, secs = cfg.webhook_concurrency, cfg.webhook_seconds
    await closed_loop(bare_url, _telegram_request, concurrency=c, duration=1.0, label="warm-up")
    await closed_loop(tg_url, _telegram_request, concurrency=c, duration=1.0, label="warm-up", first=900_000_000)
    bare: list[LoadResult] = []
    tg: list[LoadResult] = []
    for rnd in range(2):  # alternate so drift on a shared machine hits both alike
        bare.append(await closed_loop(bare_url, _telegram_request, concurrency=c, duration=secs, label="bare"))
        tg.append(await closed_loop(tg_url, _telegram_request, concurrency=c, duration=secs, label="telegram",
                                    first=rnd * 10_000_000))
    rate, rsecs = cfg.webhook_rate, cfg.webhook_rate_seconds
    open_bare = await open_loop(bare_url, _telegram_request, rate=rate, duration=rsecs, label="bare")
    open_tg = await open_loop(tg_url, _telegram_request, rate=rate, duration=rsecs, label="telegram",
                              first=50_000_000)
    return {"closed_bare": _merge("bare", bare), "closed_tg": _merge("telegram", tg),
            "open_bare": open_bare, "open_tg": open_tg}


def run(ctx: Ctx) -> None:
    stack = ctx.stack
    if not stack.has_route("/webhooks/telegram"):
        ctx.report.skipped.append(("1", "POST /webhooks/telegram not available yet (channels work)"))
        return
    for workers in (1, 2):  # one process (the default), and one per core (`nanofleet gateway --workers 2`)
        stack.reset_data()
        port = free_port()
        gateway = stack.gateway(port, workers=workers) if workers > 1 else None
        tg_url = (f"http://127.0.0.1:{port}" if gateway else stack.gateway_url) + "/webhooks/telegram"
        proc, bare_url = _start_bare(stack, workers)
        try:
            r = asyncio.run(_measure(ctx.cfg, bare_url, tg_url))
        finally:
            stack.stop_procs([proc] + ([gateway] if gateway else []))
        with stack.engine.connect() as conn:
            events = conn.execute(text("select count(*) from inbound_events where channel = 'telegram'")).scalar_one()
        _report(ctx, r, events, r["closed_tg"].ok + r["open_tg"].ok, workers)
    stack.reset_data()


def _report(ctx: Ctx, r: dict[str, LoadResult], events: int, accepted: int, workers: int) -> None:
    report, cfg = ctx.report, ctx.cfg
    cmd = cfg.command("webhook")
    setup = "1 process" if workers == 1 else f"{workers} processes"
    suffix = "" if workers == 1 else f"_{workers}p"
    ot, ob, ct, cb = r["open_tg"], r["open_bare"], r["closed_tg"], r["closed_bare"]
    rate = f"{cfg.webhook_rate:g} req/s"
    report.add(Figure("1", f"[{setup}] telegram webhook ack p50 at {rate} (open loop)", ot.pct(50), "ms", command=cmd))
    p99 = ot.pct(99)
    report.add(Figure("1", f"[{setup}] telegram webhook ack p99 at {rate} (open loop)", p99, "ms",
                      f"<= {P99_TARGET_MS:g} ms", p99 <= P99_TARGET_MS and not ot.errors, cmd,
                      note=f"{ot.ok}/{int(cfg.webhook_rate * cfg.webhook_rate_seconds)} answered 2xx"))
    report.add(Figure("1", f"[{setup}] bare endpoint p99 at {rate} (open loop)", ob.pct(99), "ms", command=cmd))
    report.add(Figure("1", f"[{setup}] bare endpoint max throughput ({cfg.webhook_concurrency} clients)", cb.rps,
                      "req/s", command=cmd))
    report.add(Figure("1", f"[{setup}] telegram webhook max throughput ({cfg.webhook_concurrency} clients)", ct.rps,
                      "req/s", command=cmd, note=f"p50 {ms(ct.pct(50))} ms, p99 {ms(ct.pct(99))} ms"))
    ratio = ct.rps / cb.rps if cb.rps else 0.0
    report.add(Figure("1", f"[{setup}] telegram / bare throughput", ratio * 100, "%", f">= {RATIO_TARGET:.0%}",
                      ratio >= RATIO_TARGET, cmd))
    report.sections.append((f"Item 1: webhook ack, {setup} (gateway and bare endpoint alike)", "\n".join([
        f"Closed loop: {cfg.webhook_concurrency} clients back to back, 2 alternating rounds of "
        f"{cfg.webhook_seconds:g} s per endpoint; open loop: {rate} for {cfg.webhook_rate_seconds:g} s, latency "
        "from the scheduled send time. Each Telegram update is new (unique update_id) across "
        f"{CHATS} chats; no worker consumes the queue meanwhile (the gateway's cost alone).",
        "",
        "| phase | requests 2xx | other | errors | p50 ms | p90 ms | p99 ms | max ms | req/s |",
        "|---|---|---|---|---|---|---|---|---|",
        *[f"| {name} | {x.ok} | {sum(x.statuses.values()) - x.ok} | {x.errors} | {ms(x.pct(50))} | "
          f"{ms(x.pct(90))} | {ms(x.pct(99))} | {ms(x.pct(100))} | {x.rps:,.0f} |"
          for name, x in (("closed, bare", cb), ("closed, telegram", ct), (f"open {rate}, bare", ob),
                          (f"open {rate}, telegram", ot))],
        "",
        f"Ledger check: {events} telegram events recorded for {accepted} accepted measured requests "
        "(plus the 1 s warm-up).",
    ])))
    cdf = f"webhook_latency{suffix}.png"
    plots.latency_cdf(ctx.plot(cdf), {f"telegram, open {rate}": ot.latencies_ms,
                                        f"bare, open {rate}": ob.latencies_ms,
                                        f"telegram, closed {cfg.webhook_concurrency}": ct.latencies_ms,
                                        f"bare, closed {cfg.webhook_concurrency}": cb.latencies_ms},
                      title="Webhook ack latency", mark_ms=P99_TARGET_MS)
    thr = f"webhook_throughput{suffix}.png"
    plots.bars(ctx.plot(thr), {"bare FastAPI": cb.rps, "telegram webhook": ct.rps},
               title=f"Max throughput, {cfg.webhook_concurrency} clients", ylabel="requests/s")
    report.plots += [(f"webhook ack latency CDF, {setup}", cdf), (f"webhook throughput, {setup}", thr)]
