"""The heartbeat: every interval, look at HEARTBEAT.md; if it lists tasks, a cheap model decides
whether to act now, and a `heartbeat` run does them and tells the most recently active chat.

An empty or missing file costs nothing (no LLM call). Each heartbeat that beat sends is handled
once: its receipt is keyed by the id of its Celery message, which a redelivery (a worker died) and
a retry keep. Neither Celery nor redbeat tells the task the time beat meant it for, and a beat that
lost its lock (paused past it while another took over) sends a due heartbeat again under a new id:
so a heartbeat is not decided within half an interval of the last one decided. The receipt is
written with the outcome of the decision, in one transaction: a decision that fails (it is
retried) or dies loses nothing. The heartbeat session keeps only its last messages, so it never
grows without bound.
"""

from __future__ import annotations

import logging
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete
from sqlmodel import Session, col, select

from shared.agent import conversations
from shared.agent.finish import deliver
from shared.agent.runtime import Next, Runtime
from shared.constants import HEARTBEAT_QUIET, INTERNAL, T_AGENT_STEP
from shared.errors import Retryable
from shared.llm_types import LLMError
from shared.models import Conversation, CronReceipt, Message, Role, Run, RunKind, utcnow
from shared.scheduling.cron import post_result, quiet, receipt
from shared.tools.workspace import OutsideWorkspace, read_text_start

log = logging.getLogger(__name__)
FILE = "HEARTBEAT.md"
SESSION = "heartbeat"
RECEIPT_JOB = "system:heartbeat"
KEEP_MESSAGES = 20
MAX_CHARS = 8000
QUIET = HEARTBEAT_QUIET
DECIDE_RETRIES = 3  # then this heartbeat is given up; the next interval brings another
KEYED_BY_ID = datetime(1970, 1, 1, tzinfo=UTC)  # a heartbeat's receipt is unique by its job id alone
# A heading (or a setext heading's underline, a rule), an empty item or checklist item, a comment
_UNDERLINE = re.compile(r"^\s*(=+|-+)\s*$")
_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")
_EMPTY_LINE = re.compile(r"^\s*(#.*|(=+|-+|\*+|_+)|([-*+]|\d+[.)])\s*(\[\s?\])?\s*|<!--.*-->)?\s*$")

DECIDE = """You check a list of periodic tasks. It is {now}. Decide whether any of them needs doing now.
Answer RUN or SKIP on the first line. After RUN, list the tasks to do now, one per line.

{tasks}"""

ACT = """[heartbeat, not typed by the user] Periodic tasks are due ({now}). Do them now:
{tasks}
Answer with what the user should hear. If there is nothing worth telling them, answer exactly {quiet}."""


def tasks(text: str) -> str:
    """The file without headings, empty checklist items and comments; empty: nothing to do."""
    lines = re.sub(r"<!--.*?-->", "", text, flags=re.S).splitlines()
    headings = {i for i in range(len(lines) - 1)  # a setext heading's text (a list item's next "---" is a rule)
                if _UNDERLINE.match(lines[i + 1]) and not _ITEM.match(lines[i])}
    return "\n".join(line for i, line in enumerate(lines) if i not in headings and not _EMPTY_LINE.match(line)).strip()


def read(rt: Runtime) -> str:
    """The tasks in HEARTBEAT.md, read as the file tools read (a symlink that leads out of the
    workspace, a FIFO or a device is refused); "" when it is missing or cannot be read."""
    workspace = rt.settings.workspace
    try:
        text, cut = read_text_start(workspace, FILE, MAX_CHARS)
    except FileNotFoundError:
        return ""
    except (OutsideWorkspace, OSError) as err:
        log.warning("heartbeat: cannot read %s: %s", workspace / FILE, err)
        return ""
    if cut:
        log.warning("heartbeat: %s is longer than %d characters; only its start is read", FILE, MAX_CHARS)
    return tasks(text)


def decide(rt: Runtime, todo: str, now: datetime) -> str | None:
    """The tasks to do now, or None to skip (the cheap call); raises LLMError."""
    prompt = DECIDE.format(now=now.isoformat(timespec="minutes"), tasks=todo)
    answer = rt.llm.complete([{"role": "user", "content": prompt}], model=rt.settings.heartbeat.model).content
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
    if conv is None:  # (an API conversation is a program's, which may not expect one)
        log.warning("heartbeat: no chat on a platform has spoken yet: the result stays in the heartbeat session")
        return {"channel": "api", "chat_id": ""}
    # The newest message from the chat knows its thread (Slack, Feishu); messages outlive runs (retention).
    last = s.exec(select(Message.meta).where(Message.conversation_id == conv.id, Message.role == Role.USER)
                  .order_by(col(Message.seq).desc()).limit(1)).first()
    origin = dict((last or {}).get("origin") or {})
    return {**origin, "channel": conv.channel, "chat_id": conv.chat_id}


def trim(s: Session, conversation_id: str, keep: int = KEEP_MESSAGES) -> None:
    """Drop all but the newest `keep` messages of the session."""
    cutoff = s.exec(select(Message.seq).where(Message.conversation_id == conversation_id)
                    .order_by(col(Message.seq).desc()).offset(keep - 1).limit(1)).first()
    if cutoff is not None:
        s.execute(delete(Message).where(col(Message.conversation_id) == conversation_id, col(Message.seq) < cutoff))


def _handled(s: Session, key: str) -> bool:
    return s.exec(select(CronReceipt.id).where(CronReceipt.job_id == key)).first() is not None


def _recent(rt: Runtime, s: Session, *, but: str | None = None) -> bool:
    """Whether a heartbeat (other than `but`) was decided less than half an interval ago."""
    since = utcnow() - timedelta(seconds=rt.settings.heartbeat.interval / 2)
    query = select(CronReceipt.id).where(col(CronReceipt.job_id).startswith(f"{RECEIPT_JOB}:"),
                                         col(CronReceipt.created_at) > since, CronReceipt.job_id != but)
    return s.exec(query.limit(1)).first() is not None


def beat(rt: Runtime, now: datetime | None = None, *, delivery: str | None = None) -> list[Next]:
    """One heartbeat; returns the first step of the run it started, if any. `delivery`: what makes
    this heartbeat one (the Celery message's id; without it, every call is its own); a second call
    with the same one does nothing."""
    now = now or utcnow()
    key = f"{RECEIPT_JOB}:{delivery or uuid.uuid4().hex}"
    todo = read(rt)
    if not todo:
        log.info("heartbeat: %s is empty or missing; nothing to do", FILE)
        return []
    with rt.session() as s:
        conv = conversations.get_or_create(s, session_key=SESSION, channel=INTERNAL, chat_id=SESSION)
        if conv.active_run_id is not None or _handled(s, key) or _recent(rt, s):
            return []  # still busy with the last one, or this heartbeat (or a copy) was handled already
    try:
        todo_now = decide(rt, todo, now)
    except LLMError as err:
        raise Retryable(f"heartbeat: the decision call failed: {err}", max_retries=DECIDE_RETRIES) from err
    with rt.session() as s:
        if receipt(s, key, KEYED_BY_ID) is None or _recent(rt, s, but=key):
            return []  # a copy of this heartbeat decided meanwhile
        if todo_now is None:
            log.info("heartbeat: nothing to do now")
            return []
        return _start(rt, s, conv.id, todo_now, now)


def _start(rt: Runtime, s: Session, conversation_id: str, todo: str, now: datetime) -> list[Next]:
    trim(s, conversation_id)
    origin = target(s)
    run_id = conversations.try_start_turn(
        s, conversation_id, origin=origin, lease_seconds=rt.settings.runtime.lease_seconds, kind=RunKind.HEARTBEAT,
        max_iterations=rt.settings.agent.max_iterations, task=todo,
    )
    if run_id is None:
        return []
    content = ACT.format(now=now.isoformat(timespec="minutes"), tasks=todo, quiet=QUIET)
    s.add(Message(conversation_id=conversation_id, run_id=run_id, role=Role.USER, content=content,
                  meta={"origin": origin}))
    return [Next(T_AGENT_STEP, (run_id, 0))]


def on_finish(rt: Runtime, s: Session, run: Run) -> list[Next]:
    """Deliver the heartbeat's result, unless it had nothing to say, and keep it in the chat's
    conversation, as a cron job's, so that a reply to it is read with it (a chat in the middle of a
    turn gets it once the turn has ended, as a cron result)."""
    if quiet(run):
        run.announced = True  # nothing to keep: not a result waiting for its chat
        s.add(run)
        return []
    return [*deliver(rt, s, run), *post_result(s, run)]
