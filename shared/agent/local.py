"""Run the same steps in-process without a broker (for `nanofleet agent`)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from shared.agent import memory, steps
from shared.agent.runtime import Next, Runtime
from shared.constants import T_AGENT_STEP, T_COMPACT, T_SUBAGENT_STEP, T_TOOL_EXECUTE
from shared.errors import Retryable

log = logging.getLogger(__name__)

Handler = Callable[[Runtime, Next], list[Next]]

HANDLERS: dict[str, Handler] = {
    T_AGENT_STEP: lambda rt, n: steps.llm_step(rt, *n.args),
    T_SUBAGENT_STEP: lambda rt, n: steps.llm_step(rt, *n.args),
    T_TOOL_EXECUTE: lambda rt, n: steps.tool_step(rt, *n.args),
    T_COMPACT: lambda rt, n: _compact(rt, *n.args),
}


def _compact(rt: Runtime, conversation_id: str, everything: bool = False, keep: int | None = None) -> list[Next]:
    try:
        memory.compact(rt, conversation_id, everything=everything, keep=keep)
    except Retryable as err:  # another process compacts this conversation: a later sweep sends it again
        log.warning("compaction of %s postponed: %s", conversation_id, err)
    return []


def drain(rt: Runtime, nexts: list[Next]) -> list[Next]:
    """Run every task inline until none is left; returns the ones with no local handler."""
    queue, skipped = deque(nexts), []
    while queue:
        nxt = queue.popleft()
        handler = HANDLERS.get(nxt.task)
        if handler is None:
            skipped.append(nxt)
            continue
        queue.extend(handler(rt, nxt))
    return skipped
