"""Outbound-queue tasks: deliver outbox rows to chat platforms, and typing indicators."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from shared.channels import delivery, typing_indicator
from shared.constants import T_OUTBOUND_DELIVER, T_OUTBOUND_TYPING
from workers.base import NanofleetTask
from workers.runtime import dispatch, runtime


@shared_task(name=T_OUTBOUND_DELIVER, base=NanofleetTask)
def deliver(outbox_id: str) -> None:
    dispatch(delivery.deliver(runtime(), outbox_id))


@shared_task(name=T_OUTBOUND_TYPING, base=NanofleetTask)
def typing(channel: str, chat_id: str, run_id: str, meta: dict[str, Any], rounds: int = 0) -> None:
    dispatch(typing_indicator.typing(runtime(), channel, chat_id, run_id, meta, rounds))
