"""`nanofleet agent`: one turn with the same core, in-process, without a broker."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import func, or_
from sqlmodel import Session, col, select

from shared.agent import conversations, lease
from shared.agent.local import drain
from shared.agent.recovery import sweep
from shared.agent.runtime import Runtime
from shared.agent.service import after_commit, submit
from shared.constants import REPORT
from shared.logs import configure_logging
from shared.migrate import upgrade
from shared.models import ACTIVE, TERMINAL, Message, Role, Run, RunKind, RunStatus
from shared.scheduling import hooks
from shared.settings import Settings
from shared.startup_checks import warn_model_key

QUEUED_POLL = 0.2  # seconds between looks at a queued message's run


@dataclass
class Answer:
    text: str
    ok: bool = True  # False when a turn failed (the text says why) or was cancelled


def _stalled(rt: Runtime, conversation_id: str) -> bool:
    with rt.session() as s:
        return s.exec(select(Run.id).where(Run.conversation_id == conversation_id, col(Run.status).in_(ACTIVE),
                                           Run.lease_owner == lease.STALLED)).first() is not None


def log_to_stderr(settings: Settings) -> None:
    """The workers' logging, secrets masked (a provider's error may repeat the API key), in plain lines
    and warnings only unless NANOFLEET_LOG_JSON / NANOFLEET_LOG_LEVEL say otherwise: the reply is the output."""
    chosen = settings.model_fields_set
    configure_logging(level=settings.log_level if "log_level" in chosen else "WARNING",
                      json=settings.log_json if "log_json" in chosen else False, secrets=settings.secrets())


def one_turn(settings: Settings, *, message: str, session: str, model: str | None = None) -> Answer:
    """The answer to `message`, and the reports of any subagents it started (they run inline too);
    first, the answer to a message an earlier call left unanswered (it died, or was stopped)."""
    upgrade(settings.database_url)
    warn_model_key(settings)
    rt = hooks.install(Runtime.build(settings))  # a subagent's report starts a turn, as in workers
    with rt.session() as s:
        conv = conversations.get_or_create(s, session_key=session, channel="cli", chat_id=session)
        since = lease.db_now(s)
    drain(rt, sweep(rt, conv.id))  # a turn an earlier `nanofleet agent` left behind when it died
    if _stalled(rt, conv.id):  # it died in a tool call, which the sweeper takes for dead a lease later
        time.sleep(rt.settings.runtime.lease_seconds + 0.5)
        drain(rt, sweep(rt, conv.id))
    with rt.session() as s:
        out = submit(rt, s, conv.id, message, origin={"channel": "api", "chat_id": session}, model=model)
    after_commit(rt, out)
    drain(rt, out.nexts)  # for a command too: /new's summary
    if out.reply is not None:
        return Answer(out.reply)
    if out.run_id is None and out.message_id is not None:
        return _queued(rt, conv.id, out.message_id)
    with rt.session() as s:
        first = s.get_one(Run, out.run_id)
        turns = list(s.exec(select(Run).where(
            Run.conversation_id == conv.id, Run.kind == RunKind.TURN,
            or_(col(Run.created_at) >= first.created_at, col(Run.finished_at) >= since),
        ).order_by(col(Run.created_at))))
        others = _answering_others(s, [r.id for r in turns if r.id != first.id and r.created_at > first.created_at])
    turns = [r for r in turns if r.id not in others]
    return Answer("\n\n".join(run.final_text or "" for run in turns),
                  ok=all(run.status == RunStatus.SUCCEEDED for run in turns))


def _answering_others(s: Session, run_ids: list[str]) -> set[str]:
    """Of the turns after this call's own, those that answer another call's message (it waited behind
    this call's turn, and that call prints its answer), not a subagent's report of this call's turn."""
    if not run_ids:
        return set()
    return set(s.exec(select(Message.run_id).where(
        col(Message.run_id).in_(run_ids), Message.role == Role.USER,
        func.coalesce(col(Message.meta)["kind"].astext, "") != REPORT)).all())  # type: ignore[arg-type]


def _queued(rt: Runtime, conversation_id: str, message_id: int) -> Answer:
    """A message that waits behind a turn another `nanofleet agent` runs on this session: that call
    answers it (it takes it in, or starts the next turn with it); wait for the run that does, and
    finish it here if the other call died meanwhile."""
    deadline = time.monotonic() + rt.settings.agent.chat_timeout
    while time.monotonic() < deadline:
        with rt.session() as s:
            found = s.exec(select(Run).join(Message, col(Message.run_id) == Run.id)
                           .where(Message.id == message_id)).first()
            if found is not None and found.status in TERMINAL:
                return Answer(found.final_text or "", ok=found.status == RunStatus.SUCCEEDED)
        drain(rt, sweep(rt, conversation_id))
        time.sleep(QUEUED_POLL)
    return Answer(f"(your message waits behind a turn still running after {rt.settings.agent.chat_timeout:g} s; "
                  "it will be answered in this session)", ok=False)
