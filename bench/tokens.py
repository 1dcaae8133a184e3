"""Item 6: prompt tokens per turn over a long conversation, with compaction on and off (and, for
scale, with neither a window nor compaction)."""

from __future__ import annotations

import statistics
import time

import httpx
import redis
from sqlalchemy import text

from bench import plots
from bench.context import Ctx
from bench.overhead import _wait_final
from bench.report import Figure
from bench.stack import AUTH

FLAT_TARGET = 1.25  # mean of the last 10 turns / mean of turns 11-20
FILLER = ("The quick brown fox jumps over the lazy dog while the agent keeps notes about it. " * 3).strip()
CONFIGS = {
    "compaction on (window 20, compact after 40)": {},
    "compaction off (window 20)": {"MEMORY__COMPACT_AFTER": "1000000000"},
    "no window, no compaction": {"MEMORY__COMPACT_AFTER": "1000000000", "MEMORY__WINDOW": "1000000"},
}


def _conversation(ctx: Ctx, turns: int) -> tuple[list[float], int]:
    """Prompt tokens of each turn, and how many compaction calls the LLM got."""
    client = redis.Redis.from_url(ctx.stack.settings.redis_url)
    before = sum(1 for r in list(ctx.llm.requests) if "Summarise the conversation" in str(r.get("messages")))
    with httpx.Client(base_url=ctx.stack.gateway_url, headers=AUTH, timeout=30) as http:
        cid = http.post("/api/v1/conversations").json()["conversationId"]
        for i in range(turns):
            http.post(f"/api/v1/conversations/{cid}/messages", json={"message": f"fact {i}: {FILLER}"})
            _wait_final(client, cid, time.monotonic() + 60)
            client.delete(f"nanofleet:events:{cid}")  # the next wait sees only the next turn's events
    with ctx.stack.engine.connect() as conn:
        tokens = [float(x) for x in conn.execute(text(
            "select prompt_tokens from runs where conversation_id = :c order by created_at"), {"c": cid}).scalars()]
    after = sum(1 for r in list(ctx.llm.requests) if "Summarise the conversation" in str(r.get("messages")))
    return tokens, after - before


def _flatness(tokens: list[float]) -> float:
    if len(tokens) < 30:
        return float("nan")
    return statistics.mean(tokens[-10:]) / statistics.mean(tokens[10:20])


def run(ctx: Ctx) -> None:
    cfg = ctx.cfg
    series: dict[str, list[float]] = {}
    summaries: dict[str, int] = {}
    for label, extra in CONFIGS.items():
        stack = ctx.stack.derive(**extra)
        stack.reset_data()
        ctx.llm.reset()
        workers = stack.workers(1, concurrency=8)
        try:
            series[label], summaries[label] = _conversation(ctx, cfg.token_turns)
        finally:
            stack.stop_procs(workers)
    cmd = cfg.command("tokens")
    on = next(iter(series.values()))
    flat = _flatness(on)
    ctx.report.add(Figure("6", "prompt tokens, last turn, compaction on", on[-1], "tokens", command=cmd,
                          note=f"{len(on)} turns, {2 * len(on)} messages"))
    ctx.report.add(Figure("6", "growth with compaction: last 10 turns / turns 11-20", flat, "x",
                          f"<= {FLAT_TARGET:g}x (flat)", flat <= FLAT_TARGET, cmd))
    for label, tokens in list(series.items())[1:]:
        ctx.report.add(Figure("6", f"prompt tokens, last turn, {label}", tokens[-1], "tokens", command=cmd,
                              note=f"growth {_flatness(tokens):.2f}x"))
    lines = ["One conversation per setting, a user message of ~250 characters per turn, replies echo it; the fake "
             "LLM counts a token per 4 characters of every message it is sent (system prompt included).", "",
             "| setting | turn 1 | turn 20 | last turn | mean | compaction calls |", "|---|---|---|---|---|---|"]
    lines += [f"| {label} | {t[0]} | {t[min(19, len(t) - 1)]} | {t[-1]} | {statistics.mean(t):.0f} | "
              f"{summaries[label]} |" for label, t in series.items()]
    ctx.report.sections.append(("Item 6: prompt tokens per turn", "\n".join(lines)))
    name = "tokens_per_turn.png"
    plots.lines(ctx.plot(name), series, title=f"Prompt tokens per turn ({cfg.token_turns} turns)",
                xlabel="turn", ylabel="prompt tokens")
    ctx.report.plots.append(("prompt tokens per turn", name))
    ctx.stack.reset_data()
