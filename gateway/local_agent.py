"""`nanofleet agent`: one turn with the same core, in-process, without a broker."""

from __future__ import annotations

from shared.agent import conversations
from shared.agent.local import drain
from shared.agent.runtime import Runtime
from shared.agent.service import submit
from shared.migrate import upgrade
from shared.models import Run
from shared.settings import Settings


def one_turn(settings: Settings, *, message: str, session: str, model: str | None = None) -> str:
    upgrade(settings.database_url)
    rt = Runtime.build(settings)
    with rt.session() as s:
        conv = conversations.get_or_create(s, session_key=session, channel="cli", chat_id=session)
        out = submit(rt, s, conv.id, message, origin={"channel": "api", "chat_id": session}, model=model)
    if out.reply is not None:
        return out.reply
    drain(rt, out.nexts)
    with rt.session() as s:
        run = s.get(Run, out.run_id) if out.run_id else None
        return (run.final_text or "") if run else "(your message is queued behind a running turn)"
