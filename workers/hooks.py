"""Per-kind finish hooks and extra sweeps, installed into the worker's runtime."""

from __future__ import annotations

from shared.agent.runtime import Runtime


def install(rt: Runtime) -> None:
    """Subagent announcements, outbox redelivery and cron reconciliation register here."""
    return None
