"""What happens when a background run ends, by run kind: every runtime that may end one installs these.

A runtime without them (the gateway's, when it cancels a run) ends a cron run without waking the
fire times that waited for it, and a heartbeat without its quiet check."""

from __future__ import annotations

from shared.agent.runtime import FinishHook, Runtime
from shared.scheduling import cron, heartbeat, subagents

FINISH_HOOKS: dict[str, FinishHook] = {
    "subagent": subagents.announce,
    "cron": cron.on_finish,
    "heartbeat": heartbeat.on_finish,
}


def install(rt: Runtime) -> Runtime:
    rt.finish_hooks.update(FINISH_HOOKS)
    return rt
