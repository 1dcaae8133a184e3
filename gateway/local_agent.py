"""`nanofleet agent`: one turn with the same core, in-process, without a broker."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlmodel import col, select

from shared.agent import conversations, lease
from shared.agent.local import drain
from shared.agent.recovery import sweep
from shared.agent.runtime import Runtime
from shared.agent.service import after_commit, submit
from shared.migrate import upgrade
from shared.models import ACTIVE, Run, RunKind, RunStatus
from shared.scheduling import hooks
from shared.settings import Settings
from shared.startup_checks import warn_model_key


@dataclass
class Answer:
    text: str
    ok: bool = True  # False when a turn failed (the text says why) or was cancelled


def _stalled(rt: Runtime, conversation_id: str) -> bool:
    with rt.session() as s:
        return s.exec(select(Run.id).where(Run.conversation_id == conversation_id, col(Run.status).in_(ACTIVE),
                                           Run.lease_owner == lease.STALLED)).first() is not None


def one_turn(settings: Settings, *, message: str, session: str, model: str | None = None) -> Answer:
    """The answer to `message`, and the reports of any subagents it started (they run inline too)."""
    upgrade(settings.database_url)
    warn_model_key(settings)
    rt = hooks.install(Runtime.build(settings))  # a subagent's report starts a turn, as in workers
    with rt.session() as s:
        conv = conversations.get_or_create(s, session_key=session, channel="cli", chat_id=session)
    drain(rt, sweep(rt, conv.id))  # a turn an earlier `nanofleet agent` left behind when it died
    if _stalled(rt, conv.id):  # it died in a tool call, which the sweeper takes for dead a lease later
        time.sleep(rt.settings.runtime.lease_seconds + 0.5)
        drain(rt, sweep(rt, conv.id))
    with rt.session() as s:
        out = submit(rt, s, conv.id, message, origin={"channel": "api", "chat_id": session}, model=model)
    after_commit(rt, out)
    drain(rt, out.nexts)  # for a command too: /new's summary, the turn that /stop let start
    if out.reply is not None:
        return Answer(out.reply)
    with rt.session() as s:
        first = s.get(Run, out.run_id) if out.run_id else None
        if first is None:
            return Answer("(your message is queued behind a running turn)", ok=False)
        turns = list(s.exec(select(Run).where(Run.conversation_id == conv.id, Run.kind == RunKind.TURN,
                                              col(Run.created_at) >= first.created_at).order_by(col(Run.created_at))))
    return Answer("\n\n".join(run.final_text or "" for run in turns),
                  ok=all(run.status == RunStatus.SUCCEEDED for run in turns))
