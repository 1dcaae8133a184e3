"""Items 3 and 4: turns in flight with a slow (2 s) fake LLM as concurrency rises, and turns/s with
one and with two agent worker processes at saturation (zero-latency LLM)."""

from __future__ import annotations

import asyncio

from bench import plots
from bench.context import Ctx
from bench.driver import Driver, Level
from bench.report import Figure
from bench.stack import BenchStack, tree_memory
from tests.fakes.llm import Reply
from tests.support.processes import Proc, wait_until

IN_FLIGHT_TARGET, RSS_TARGET_MIB, SCALE_TARGET = 1000, 1024, 1.8
HOLD_SECONDS = 40.0  # the hold test's LLM latency: long enough that no turn ends while they are opened
NO_COMPACTION = {"MEMORY__COMPACT_AFTER": "1000000000"}


def _mean(xs: list[int]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _saturated(levels: list[Level]) -> bool:
    """Throughput stopped growing: the last two levels gained < 5 % over the best before them."""
    if len(levels) < 3:
        return False
    best = max(lv.rate for lv in levels[:-2])
    return all(lv.rate < best * 1.05 for lv in levels[-2:])


def _drive(ctx: Ctx, workers: list[Proc], levels: list[int], *, ramp: float, window: float,
           stop_when_saturated: bool) -> list[Level]:
    driver = Driver(ctx.stack.gateway_url, ctx.stack.engine, in_flight=lambda: ctx.llm.in_flight,
                    rss=lambda: sum(tree_memory(w.pid) for w in workers), calls=ctx.llm.calls,
                    open_between=ctx.llm.mean_in_flight)
    return asyncio.run(driver.run(levels, ramp=ramp, window=window,
                                  saturated=_saturated if stop_when_saturated else None))


def run_inflight(ctx: Ctx) -> None:
    cfg, stack = ctx.cfg, ctx.stack.derive(**NO_COMPACTION)
    stack.reset_data()
    delay = cfg.llm_delay
    ctx.llm.handler = lambda body: Reply(text="ok", delay=delay)
    workers = stack.workers(1, queues="agent", concurrency=cfg.inflight_threads)
    try:
        levels = _drive(ctx, workers, cfg.levels(), ramp=max(3.0, 1.5 * delay), window=cfg.inflight_window,
                        stop_when_saturated=True)
        held = _hold(ctx, stack, workers)
    finally:
        stack.stop_procs(workers)
        ctx.llm.reset()
    _report_inflight(ctx, levels, held)
    stack.reset_data()


def _hold(ctx: Ctx, stack: BenchStack, workers: list[Proc]) -> tuple[float, int, float]:
    """Open the last level's count of turns at once; the turns left open are dropped with the worker."""
    stack.reset_data()
    wait_until(lambda: ctx.llm.in_flight == 0, timeout=HOLD_SECONDS + 10, interval=0.2,
               message="the fake LLM's earlier calls to end")
    ctx.llm.handler = lambda body: Reply(text="ok", delay=HOLD_SECONDS)
    driver = Driver(stack.gateway_url, stack.engine, in_flight=lambda: ctx.llm.in_flight,
                    rss=lambda: sum(tree_memory(w.pid) for w in workers))
    return asyncio.run(driver.hold(ctx.cfg.levels()[-1], timeout=HOLD_SECONDS - 2, drain=2.0))


def _report_inflight(ctx: Ctx, levels: list[Level], held: tuple[float, int, float]) -> None:
    cmd, cfg = ctx.cfg.command("inflight"), ctx.cfg
    best = max(levels, key=lambda lv: lv.rate)
    peak = max(levels, key=lambda lv: lv.mean_in_flight)
    rss = max(lv.max_rss_mib for lv in levels)
    ctx.report.add(Figure("3", f"turns in flight at saturation ({cfg.llm_delay:g} s LLM, mean LLM calls open)",
                          peak.mean_in_flight, "", f">= {IN_FLIGHT_TARGET:,}",
                          peak.mean_in_flight >= IN_FLIGHT_TARGET, cmd,
                          note=f"client kept {peak.target} turns open"))
    ctx.report.add(Figure("3", "turns/s at saturation", best.rate, "turns/s", command=cmd,
                          note=f"at {best.target} open"))
    ctx.report.add(Figure("3", "agent worker RSS, max over the run (process tree)", rss, "MiB",
                          f"<= {RSS_TARGET_MIB:,} MiB", rss <= RSS_TARGET_MIB, cmd,
                          note=f"threads pool, -c {cfg.inflight_threads}"))
    n, most, rss_held, secs = cfg.levels()[-1], held[0], held[1] / 2**20, held[2]
    ctx.report.add(Figure("3", f"hold test: turns held open at once ({HOLD_SECONDS:g} s LLM)", most, "",
                          f">= {IN_FLIGHT_TARGET:,}", most >= IN_FLIGHT_TARGET, cmd,
                          note=f"{n} opened; most after {secs:.0f} s"))
    ctx.report.add(Figure("3", "hold test: agent worker RSS while holding them", rss_held, "MiB",
                          f"<= {RSS_TARGET_MIB:,} MiB", rss_held <= RSS_TARGET_MIB, cmd))
    lines = [f"One agent worker (`-P threads -c {cfg.inflight_threads}`, queue `agent`), the fake LLM answers "
             f"after {cfg.llm_delay:g} s; the client keeps N turns open through `POST .../messages` (one per idle "
             f"conversation) and raises N until turns/s stops growing. Window {cfg.inflight_window:g} s per level.",
             "", "Turns open is the client's own count (submitted, not finished), below the target while the "
             "gateway is still taking submissions. LLM calls in flight is the fake LLM's own time-weighted mean "
             "over the window (each call's time open, summed, over the window), which Little's law ties to the "
             "calls begun per second times the LLM's latency; beside it, the mean of the fake's counter as the "
             "client sampled it every 0.2 s (the figure reported before 2026-11-28), as a cross-check. Turns/s "
             "agrees with calls begun/s while the worker keeps up; at saturation they part, as turns begun in "
             "one window finish in a later one.",
             "", "| turns kept open | turns open (mean) | LLM calls in flight (mean) | (sampled) | LLM calls begun/s "
             "| turns/s | failed | worker RSS max MiB |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {lv.target} | {_mean(lv.outstanding):.0f} | {lv.mean_in_flight:.0f} | {lv.sampled_in_flight:.0f} "
              f"| {lv.call_rate:.1f} | {lv.rate:.1f} | {lv.failed} | {lv.max_rss_mib:.0f} |" for lv in levels]
    lines += ["", f"Hold test: the fake LLM answers after {HOLD_SECONDS:g} s and the client opens {n} turns as "
              f"fast as the gateway takes them: {most:.0f} LLM calls were open at once after {secs:.0f} s, the "
              f"worker tree using {rss_held:.0f} MiB. This separates what one worker can hold (threads, memory) "
              f"from the rate at which this host can start and finish turns (by Little's law, {IN_FLIGHT_TARGET:,} "
              f"open turns with a {cfg.llm_delay:g} s LLM need {IN_FLIGHT_TARGET / cfg.llm_delay:,.0f} turns/s). "
              "The worker's LLM HTTP pool is NANOFLEET_LLM__MAX_CONNECTIONS (1,000 by default)."]
    ctx.report.sections.append(("Item 3: in-flight turns", "\n".join(lines)))
    name = "inflight.png"
    plots.concurrency_curve(ctx.plot(name), [(lv.target, lv.rate, lv.mean_in_flight, lv.max_rss_mib)
                                             for lv in levels],
                            title=f"In-flight turns, {cfg.llm_delay:g} s fake LLM, one worker")
    ctx.report.plots.append(("throughput vs concurrency", name))


def _scale_point(ctx: Ctx, stack: BenchStack, n: int) -> Level:
    workers = stack.workers(n, queues="agent", concurrency=16)
    try:
        return _drive(ctx, workers, [ctx.cfg.scale_concurrency], ramp=3.0, window=ctx.cfg.scale_window,
                      stop_when_saturated=False)[0]
    finally:
        stack.stop_procs(workers)


def run_scaleout(ctx: Ctx) -> None:
    stack = ctx.stack.derive(**NO_COMPACTION)
    stack.reset_data()
    one = _scale_point(ctx, stack, 1)
    stack.reset_data()
    two = _scale_point(ctx, stack, 2)
    stack.reset_data()
    cmd = ctx.cfg.command("scaleout")
    ratio = two.rate / one.rate if one.rate else 0.0
    note = f"{ctx.cfg.scale_concurrency} turns kept open, zero-latency LLM, -P threads -c 16 each"
    ctx.report.add(Figure("4", "turns/s, 1 agent worker process", one.rate, "turns/s", command=cmd, note=note))
    ctx.report.add(Figure("4", "turns/s, 2 agent worker processes", two.rate, "turns/s", command=cmd))
    ctx.report.add(Figure("4", "scale-out 2 / 1 workers", ratio, "x", f">= {SCALE_TARGET:g}x",
                          ratio >= SCALE_TARGET, cmd))
    name = "scaleout.png"
    plots.bars(ctx.plot(name), {"1 worker": one.rate, "2 workers": two.rate},
               title="Turns/s at saturation (zero-latency LLM)", ylabel="turns/s")
    ctx.report.plots.append(("scale-out", name))
