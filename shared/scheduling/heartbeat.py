"""The heartbeat: every interval, look at HEARTBEAT.md; if it lists tasks, a cheap model decides
whether to act now, and a `heartbeat` run does them and tells the most recently active chat.

An empty or missing file costs nothing (no LLM call). Each interval is claimed with a receipt
before the decision, so a replayed or duplicated beat never decides or runs twice. The heartbeat
session keeps only its last messages, so it never grows without bound.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete
from sqlmodel import Session, col, select

from shared.agent import conversations
from shared.agent.finish import deliver
from shared.agent.runtime import Next, Runtime
from shared.constants import T_AGENT_STEP
from shared.llm import LLMError
from shared.models import Conversation, Message, Role, Run, RunKind, utcnow
from shared.scheduling.cron import INTERNAL, receipt

log = logging.getLogger(__name__)
FILE = "HEARTBEAT.md"
SESSION = "heartbeat"
RECEIPT_JOB = "system:heartbeat"
KEEP_MESSAGES = 20
MAX_CHARS = 8000
QUIET = "HEARTBEAT_OK"
_EMPTY_LINE = re.compile(r"^\s*(#.*|[-*+]\s*(\[\s?\])?\s*|<!--.*-->)?\s*$")

DECIDE = """You check a list of periodic tasks. It is {now}. Decide whether any of them needs doing now.
Answer RUN or SKIP on the first line. After RUN, list the tasks to do now, one per line.

{tasks}"""

ACT = """[heartbeat, not typed by the user] Periodic tasks are due ({now}). Do them now:
{tasks}
Answer with what the user should hear. If there is nothing worth telling them, answer exactly {quiet}."""


def tasks(text: str) -> str:
    """The file without headings, empty checklist items and comments; empty: nothing to do."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not _EMPTY_LINE.match(line)).strip()


def read(rt: Runtime) -> str:
    path = rt.settings.workspace / FILE
    try:
        return tasks(path.read_text(errors="replace")[:MAX_CHARS]) if path.is_file() else ""
    except OSError as err:
        log.warning("heartbeat: cannot read %s: %s", path, err)
        return ""


def slot(now: datetime, interval: int) -> datetime:
    """The start of the interval `now` falls in: the heartbeat's receipt key."""
    ts = int(now.timestamp())
    return datetime.fromtimestamp(ts - ts % max(1, interval), UTC)


def decide(rt: Runtime, todo: str, now: datetime) -> str | None:
    """The tasks to do now, or None to skip (the cheap call)."""
    prompt = DECIDE.format(now=now.isoformat(timespec="minutes"), tasks=todo)
    try:
        answer = rt.llm.complete([{"role": "user", "content": prompt}], model=rt.settings.heartbeat.model).content
    except LLMError as err:
        log.warning("heartbeat: the decision call failed: %s", err)
        return None
    lines = [line.strip() for line in (answer or "").strip().splitlines() if line.strip()]
    if not lines or not lines[0].upper().startswith("RUN"):
        return None
    return "\n".join(lines[1:]) or todo


def target(s: Session) -> dict[str, Any]:
    """Where the result goes: the most recently active chat on a real channel (none: keep it here)."""
    conv = s.exec(
        select(Conversation)
        .where(col(Conversation.channel).not_in((INTERNAL, "api", "cli")), col(Conversation.chat_id) != "")
        .order_by(col(Conversation.last_active_at).desc()).limit(1)
    ).first()
    if conv is None:
        return {"channel": "api", "chat_id": ""}
    last = s.exec(select(Run).where(Run.conversation_id == conv.id, Run.kind == RunKind.TURN)
                  .order_by(col(Run.created_at).desc()).limit(1)).first()
    origin = dict(last.origin) if last and last.origin else {}
    return {**origin, "channel": conv.channel, "chat_id": conv.chat_id}


def trim(s: Session, conversation_id: str, keep: int = KEEP_MESSAGES) -> None:
    """Drop all but the newest `keep` messages of the session."""
    cutoff = s.exec(select(Message.seq).where(Message.conversation_id == conversation_id)
                    .order_by(col(Message.seq).desc()).offset(keep - 1).limit(1)).first()
    if cutoff is not None:
        s.execute(delete(Message).where(col(Message.conversation_id) == conversation_id, col(Message.seq) < cutoff))


def beat(rt: Runtime, now: datetime | None = None) -> list[Next]:
    """One heartbeat; returns the first step of the run it started, if any."""
    now = now or utcnow()
    todo = read(rt)
    if not todo:
        log.info("heartbeat: %s is empty or missing; nothing to do", FILE)
        return []
    with rt.session() as s:
        conv = conversations.get_or_create(s, session_key=SESSION, channel=INTERNAL, chat_id=SESSION)
        if conv.active_run_id is not None or receipt(s, RECEIPT_JOB, slot(now, rt.settings.heartbeat.interval)) is None:
            return []  # still busy with the last one, or this interval was handled already
    todo_now = decide(rt, todo, now)
    if todo_now is None:
        log.info("heartbeat: nothing to do now")
        return []
    with rt.session() as s:
        trim(s, conv.id)
        origin = target(s)
        run = conversations.try_start_turn(
            s, conv.id, origin=origin, lease_seconds=rt.settings.runtime.lease_seconds, kind=RunKind.HEARTBEAT,
            max_iterations=rt.settings.agent.max_iterations, task=todo_now,
        )
        if run is None:
            return []
        content = ACT.format(now=now.isoformat(timespec="minutes"), tasks=todo_now, quiet=QUIET)
        s.add(Message(conversation_id=conv.id, run_id=run.id, role=Role.USER, content=content, meta={"origin": origin}))
    return [Next(T_AGENT_STEP, (run.id, 0))]


def on_finish(rt: Runtime, s: Session, run: Run) -> list[Next]:
    """Deliver the heartbeat's result, unless it had nothing to say."""
    if (run.final_text or "").strip().upper().startswith(QUIET):
        return []
    return deliver(rt, s, run)
