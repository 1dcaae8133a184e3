"""Run the same steps in-process without a broker (for `nanofleet agent`)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from shared.agent import memory, steps
from shared.agent.runtime import Next, Runtime
from shared.constants import T_AGENT_STEP, T_COMPACT, T_SUBAGENT_STEP, T_TOOL_EXECUTE
from shared.errors import Retryable

log = logging.getLogger(__name__)

Handler = Callable[[Runtime, Next], list[Next]]
RETRY_DELAY, MAX_RETRY_DELAY = 0.1, 2.0  # seconds before a task that raised runs again: doubled each time

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


def drain(rt: Runtime, nexts: list[Next], retries: int | None = None) -> list[Next]:
    """Run every task inline until none is left; returns the ones with no local handler. A task that
    raises is run again at once, a little later each time, as the sweeper would send it (a step
    counts its failures and fails its run at `max_recoveries`): after `retries` more tries (default
    `max_recoveries`: the database is gone) it is raised."""
    retries = rt.settings.runtime.max_recoveries if retries is None else retries
    queue, skipped = deque((nxt, 0) for nxt in nexts), []
    while queue:
        nxt, failed = queue.popleft()
        handler = HANDLERS.get(nxt.task)
        if handler is None:
            skipped.append(nxt)
            continue
        try:
            queue.extend((more, 0) for more in handler(rt, nxt))
        except Exception as err:
            if failed >= retries:
                raise
            log.warning("%s%s failed (%s); trying it again", nxt.task, nxt.args, type(err).__name__)
            time.sleep(min(RETRY_DELAY * 2**failed, MAX_RETRY_DELAY))
            queue.appendleft((nxt, failed + 1))
    return skipped
