"""The chaos run's fake model and its accounting.

Every inbound message carries a tag (`tag-N`) and asks for an action: `record` (a tool call with a
side effect the run can count), `spawn` (also a subagent `sub-N`) or `cron` (also a one-shot cron
job `cron-N`). The model answers from the transcript it is sent, so a message folded into another
turn, replayed steps and crashes do not confuse it: it calls tools for tags it has not called yet,
then answers `done:` naming every tag and mention it has not answered yet. At the end each tag must
appear in exactly one reply, each record must have run at most once (zero only when the runtime
reported the call as interrupted), and each subagent and cron firing must have started once and
finished.

One duplicate is allowed and counted apart: a reply the platform received twice from one outbox row
whose first send was followed within KILL_WINDOW seconds by a worker SIGKILL. That is the
documented send/mark window (docs/channels.md): the worker died between Telegram's 200 and the
mark-delivered UPDATE, and the Bot API has no idempotency key to drop the resend."""

from __future__ import annotations

import datetime as dt
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from tests.fakes.llm import Reply

TAG = re.compile(r"\btag-(\d+)\b")
MENTION = re.compile(r"\b((?:sub|cron)-\d+)\b")
ACTIONS = ("record", "spawn", "cron")
CRON_DELAY = 15  # seconds from the model's answer to the job's `at`
KILL_WINDOW = 2.0  # seconds after a send in which a worker kill explains its resend


def action_of(i: int) -> str:
    """Most messages only record; one in ten spawns a subagent, one in ten schedules a cron job."""
    return {3: "spawn", 7: "cron"}.get(i % 10, "record")


def message_text(i: int, action: str) -> str:
    return f"tag-{i} please {action}"


def _calls(tags: list[str], actions: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []
    for n in tags:
        calls.append(("record", {"tag": f"tag-{n}"}))
        if actions.get(n) == "spawn":
            calls.append(("spawn", {"task": f"background job sub-{n}", "label": f"sub-{n}"}))
        elif actions.get(n) == "cron":
            at = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=CRON_DELAY)).isoformat()
            calls.append(("cron", {"action": "add", "message": f"scheduled reminder cron-{n}", "at": at,
                                   "missed_policy": "run_once", "name": f"cron-{n}"}))
    return calls


def handler(max_delay: float) -> Callable[[dict[str, Any]], Reply]:
    """The fake model's behaviour (see the module docstring)."""

    def handle(body: dict[str, Any]) -> Reply:
        messages = [m for m in body.get("messages", [])
                    if not str(m.get("content") or "").startswith("[runtime context")]
        delay = random.uniform(0, max_delay)
        system = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
        users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
        if users and "Summarise the conversation" in users[-1]:
            return Reply(text="SUMMARY: the earlier messages were handled.")
        if "background subagent" in system:
            return Reply(text="finished " + " ".join(MENTION.findall(" ".join(users))), delay=delay)
        requested: dict[str, str] = {}
        mentions: list[str] = []
        called: set[str] = set()
        answered: set[str] = set()
        for m in messages:
            content = str(m.get("content") or "")
            if m.get("role") == "user":
                for n in TAG.findall(content):
                    requested.setdefault(n, next((a for a in ACTIONS if f"please {a}" in content), "record"))
                mentions += [x for x in dict.fromkeys(MENTION.findall(content)) if x not in mentions]
            elif m.get("role") == "assistant":
                for call in m.get("tool_calls") or []:
                    called.update(TAG.findall(str(call.get("function", {}).get("arguments", ""))))
                answered.update(TAG.findall(content))
                answered.update(MENTION.findall(content))
        new = [n for n in requested if n not in called and n not in answered]
        if new:
            return Reply(tool_calls=_calls(new, requested), delay=delay)
        due = [f"tag-{n}" for n in requested if n in called and n not in answered]
        due += [x for x in mentions if x not in answered]
        return Reply(text="done: " + (" ".join(due) if due else "nothing new"), delay=delay)

    return handle


@dataclass
class Tally:
    """Per-tag counts gathered after the drain."""

    n: int
    stored: Counter[str] = field(default_factory=Counter)  # USER messages per tag (the ledger's work)
    replies: Counter[str] = field(default_factory=Counter)  # replies naming the tag
    executions: Counter[str] = field(default_factory=Counter)  # record tool runs per tag
    interrupted: set[str] = field(default_factory=set)  # record calls reported "may or may not"
    subagents: dict[str, list[str]] = field(default_factory=dict)  # sub-N -> statuses of its runs
    crons: dict[str, list[str]] = field(default_factory=dict)  # cron-N -> statuses of its firings
    cron_refused: set[str] = field(default_factory=set)  # adds the tool refused (`at` passed before it ran)
    mention_replies: Counter[str] = field(default_factory=Counter)
    window_resent: set[str] = field(default_factory=set)  # tags and mentions resent in the send/mark window
    failed_runs: list[str] = field(default_factory=list)
    stuck_runs: list[str] = field(default_factory=list)

    def tags(self) -> list[str]:
        return [f"tag-{i}" for i in range(self.n)]

    def lost(self) -> list[str]:
        return [t for t in self.tags() if self.replies[t] == 0]

    def duplicated(self) -> list[str]:
        """Received more than once, and not explained by a kill in the send/mark window."""
        return [t for t in self.tags() if self.replies[t] > 1 and t not in self.window_resent]

    def resent_in_window(self) -> list[str]:
        return [t for t in self.tags() if self.replies[t] > 1 and t in self.window_resent]

    def reexecuted(self) -> list[str]:
        return [t for t in self.tags() if self.executions[t] > 1]

    def unexecuted(self) -> list[str]:
        """Never executed and not reported as interrupted: a call that silently vanished."""
        return [t for t in self.tags() if self.executions[t] == 0 and t not in self.interrupted]

    def stored_wrong(self) -> list[str]:
        return [t for t in self.tags() if self.stored[t] != 1]


@dataclass(frozen=True)
class Received:
    """One message the platform received."""

    at: float  # wall clock
    chat_id: str
    text: str


def window_resends(received: list[Received], rows: Counter[tuple[str, str]], kills: list[float]) -> set[str]:
    """Tags and mentions of texts received twice from one outbox row (`rows` counts rows per
    (chat, text)) whose first arrival a worker kill followed within KILL_WINDOW seconds."""
    arrivals: dict[tuple[str, str], list[float]] = {}
    for r in received:
        arrivals.setdefault((r.chat_id, r.text), []).append(r.at)
    out: set[str] = set()
    for key, times in arrivals.items():
        first = min(times)
        if len(times) == 2 and rows[key] == 1 and any(first <= k <= first + KILL_WINDOW for k in kills):
            out.update(f"tag-{x}" for x in TAG.findall(key[1]))
            out.update(MENTION.findall(key[1]))
    return out


def collect(engine: Engine, workspace: Path, n: int, replies: list[str], window: set[str] | None = None) -> Tally:
    """Count everything per tag from Postgres, the executions log and the replies."""
    t = Tally(n, window_resent=window or set())
    for body in replies:
        t.replies.update({f"tag-{x}" for x in TAG.findall(body)})  # replies naming it, not mentions
        t.mention_replies.update(set(MENTION.findall(body)))
    log = workspace / "executions.log"
    for line in log.read_text().splitlines() if log.exists() else []:
        t.executions[line.split()[-1]] += 1
    with engine.connect() as conn:
        for content in conn.execute(text("select content from messages where role = 'USER'")).scalars():
            t.stored.update(f"tag-{x}" for x in TAG.findall(content) if content.startswith(f"tag-{x} please"))
        for args in conn.execute(text("select arguments->>'tag' from tool_calls where name = 'record' and "
                                      "status = 'FAILED' and result->>'message' like '%may or may not%'")).scalars():
            t.interrupted.add(str(args))
        for msg in conn.execute(text("select arguments->>'message' from tool_calls where name = 'cron' and "
                                     "result->>'error' = 'INVALID_ARGS'")).scalars():
            t.cron_refused.update(MENTION.findall(str(msg)))
        for kind, task, status in conn.execute(text("select kind, coalesce(task, ''), status from runs "
                                                    "where kind in ('subagent', 'cron')")).all():
            for x in MENTION.findall(task):
                (t.subagents if kind == "subagent" else t.crons).setdefault(x, []).append(status)
        t.failed_runs = list(conn.execute(text("select id from runs where status = 'failed'")).scalars())
        t.stuck_runs = list(conn.execute(text("select id from runs where status in ('queued', 'running')")).scalars())
    return t
