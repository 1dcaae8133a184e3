"""Per-kind finish hooks and extra sweeps, installed into the worker's runtime."""

from __future__ import annotations

from shared.agent.recovery import EXTRA_SWEEPS
from shared.agent.runtime import Runtime
from shared.channels.delivery import redeliver
from shared.scheduling import cron, heartbeat, subagents


def install(rt: Runtime) -> None:
    """Subagent announcements, outbox redelivery and cron reconciliation register here."""
    EXTRA_SWEEPS.append(redeliver)
    rt.finish_hooks["subagent"] = subagents.announce
    rt.finish_hooks["cron"] = cron.on_finish
    rt.finish_hooks["heartbeat"] = heartbeat.on_finish
    return None
