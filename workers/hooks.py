"""Per-kind finish hooks and extra sweeps, installed into the worker's runtime."""

from __future__ import annotations

from shared.agent.recovery import EXTRA_SWEEPS
from shared.agent.runtime import Runtime
from shared.channels.delivery import redeliver
from shared.channels.inbound import resubmit
from shared.scheduling import hooks


def install(rt: Runtime) -> None:
    """Subagent announcements, outbox redelivery, lost inbound submissions and cron reconciliation
    register here."""
    EXTRA_SWEEPS.extend([redeliver, resubmit])
    hooks.install(rt)
