"""The "typing..." indicator a turn shows in its chat while it runs (the outbound queue's other task)."""

from __future__ import annotations

import logging
from typing import Any

from shared.agent.runtime import Next, Runtime
from shared.channels.delivery import channel_for
from shared.constants import T_OUTBOUND_TYPING
from shared.models import TERMINAL, Run

log = logging.getLogger(__name__)
TYPING_FOR = 180.0  # seconds of "typing..." at most in one turn


def typing(rt: Runtime, channel: str, chat_id: str, run_id: str, meta: dict[str, Any], rounds: int) -> list[Next]:
    """Best effort "typing..." while the run is going, renewed until it ends."""
    with rt.session() as s:
        run = s.get(Run, run_id)
    ch = channel_for(rt.settings, channel)
    if run is None or run.status in TERMINAL or ch is None or not ch.enabled():
        return []
    if rounds * ch.typing_every >= TYPING_FOR:
        return []
    try:
        if not ch.typing(chat_id, meta):
            return []
    except Exception as err:  # a missed typing indicator is not worth a retry
        log.debug("typing in %s %s failed: %s", channel, chat_id, err)
    return [Next(T_OUTBOUND_TYPING, (channel, chat_id, run_id, meta, rounds + 1), countdown=ch.typing_every)]
