"""The chaos run's verdict: a printed table and CHAOS.md, with the offending ids for any failure."""

from __future__ import annotations

import argparse
from typing import Any

from bench.chaos_check import Tally
from bench.report import machine_markdown

SHOW = 12  # ids listed per failing row


def _ids(items: list[str]) -> str:
    return ", ".join(items[:SHOW]) + (f" ... (+{len(items) - SHOW})" if len(items) > SHOW else "")


def _rows(t: Tally, facts: dict[str, Any]) -> list[tuple[str, int, str, bool]]:
    """(check, count, detail, ok)."""
    subs = {k: v for k, v in t.subagents.items()}
    crons = {k: v for k, v in t.crons.items()}
    spawned = [f"sub-{n}" for n in range(t.n) if n % 10 == 3]
    scheduled = [f"cron-{n}" for n in range(t.n) if n % 10 == 7 and f"cron-{n}" not in t.cron_refused]
    rows = [
        ("inbound messages", t.n, f"{facts['sent']} requests answered 2xx, {facts['failed_attempts']} "
                                  "attempts refused or failed (retried)", True),
        ("messages abandoned by the client", len(facts["abandoned"]), _ids([str(i) for i in facts["abandoned"]]),
         not facts["abandoned"]),
        ("messages not stored exactly once", len(t.stored_wrong()), _ids(t.stored_wrong()), not t.stored_wrong()),
        ("replies lost", len(t.lost()), _ids(t.lost()), not t.lost()),
        ("replies duplicated", len(t.duplicated()), _ids(t.duplicated()), not t.duplicated()),
        ("replies resent in the send/mark window (a worker SIGKILLed just after Telegram took it; "
         "docs/channels.md)", len(t.resent_in_window()), _ids(t.resent_in_window()), True),
        ("tool calls re-executed", len(t.reexecuted()), _ids(t.reexecuted()), not t.reexecuted()),
        ("tool calls interrupted (reported, not re-run)", len(t.interrupted), _ids(sorted(t.interrupted)), True),
        ("... of which the side effect did happen (the model was told it may not have)",
         len([x for x in t.interrupted if t.executions[x]]), _ids(sorted(x for x in t.interrupted if t.executions[x])),
         True),
        ("tool calls vanished (not run, not reported)", len(t.unexecuted()), _ids(t.unexecuted()),
         not t.unexecuted()),
    ]
    for label, expected, seen in (("subagents", spawned, subs), ("cron firings", scheduled, crons)):
        missing = [x for x in expected if x not in seen]
        extra = [x for x, statuses in seen.items() if len(statuses) > 1]
        unfinished = [x for x, statuses in seen.items() if "succeeded" not in statuses]
        rows += [(f"{label} started / expected", len(seen), f"of {len(expected)}", True),
                 (f"{label} never started", len(missing), _ids(missing), not missing),
                 (f"{label} started twice", len(extra), _ids(extra), not extra),
                 (f"{label} not completed", len(unfinished), _ids(unfinished), not unfinished)]
        unanswered = [x for x in seen if t.mention_replies[x] == 0]
        doubled = [x for x in seen if t.mention_replies[x] > 1 and x not in t.window_resent]
        windowed = [x for x in seen if t.mention_replies[x] > 1 and x in t.window_resent]
        rows += [(f"{label}: results not reported to the chat", len(unanswered), _ids(unanswered), not unanswered),
                 (f"{label}: results reported twice", len(doubled), _ids(doubled), not doubled),
                 (f"{label}: results resent in the send/mark window", len(windowed), _ids(windowed), True)]
    rows += [("cron adds refused by the tool (`at` had passed when it ran; not expected)", len(t.cron_refused),
              _ids(sorted(t.cron_refused)), True)]
    exits = [what.split(" (")[0].split(";")[0] for _, what in facts["events"] if "EXITED BY ITSELF" in what]
    rows += [("processes that exited by themselves (restarted, as compose would; see the timeline)", len(exits),
              _ids(exits), True)]
    rows += [("runs failed", len(t.failed_runs), _ids(t.failed_runs), not t.failed_runs),
             ("runs still active after the drain", len(t.stuck_runs), _ids(t.stuck_runs), not t.stuck_runs),
             ("settled within the drain time", int(bool(facts["settled"])), "", bool(facts["settled"]))]
    return rows


def render(t: Tally, facts: dict[str, Any], args: argparse.Namespace, command: str) -> tuple[str, str, bool]:
    rows = _rows(t, facts)
    ok = all(r[3] for r in rows)
    width = max(len(r[0]) for r in rows)
    table = "\n".join(f"{'ok ' if r[3] else 'BAD'} {r[0].ljust(width)} {r[1]:>6}  {r[2]}" for r in rows)
    table += f"\n\nverdict: {'PASS' if ok else 'FAIL'} ({facts['elapsed']:.0f}s; logs in {facts['logs']})"
    via = "Telegram webhooks (each delivered 3 times)" if facts["via"] == "telegram" else "the REST API (once each)"
    md = ["# nanofleet chaos run", "", machine_markdown(), "", f"Command: `{command}`", "",
          f"{t.n} messages across {args.chats} chats over {args.seconds:g} s through {via}; a worker SIGKILLed about "
          f"every {args.kill_every:g} s (and a new one started); the gateway, beat, Redis (no persistence: its "
          "queues and schedule are lost) and Postgres (SIGKILL of every backend, crash recovery) each killed "
          "once; a process that exits by itself is restarted (as compose's restart policy would) and listed. "
          "Three workers for all queues (`-P threads -c 16`; a kill only when two are up), lease 4 s, sweep 1 s.",
          "",
          f"**Verdict: {'PASS' if ok else 'FAIL'}**", "", "| check | count | ok | detail |", "|---|---|---|---|"]
    md += [f"| {r[0]} | {r[1]} | {'yes' if r[3] else '**NO**'} | {r[2]} |" for r in rows]
    md += ["", "## Fault timeline", "", "| t (s) | event |", "|---|---|"]
    md += [f"| {at:.1f} | {what} |" for at, what in facts["events"]]
    return table, "\n".join(md) + "\n", ok
