"""Ids derived from the tool call that creates something, so a replayed call finds what it made."""

from __future__ import annotations

import uuid

from sqlmodel import Session, col, select

from shared.models import ToolCall


def call_key(s: Session, run_id: str, call_id: str) -> str:
    """The journal key of the executing tool call: (run, step, call id), since some models reuse ids."""
    step = s.exec(select(ToolCall.step_seq).where(ToolCall.run_id == run_id, ToolCall.call_id == call_id)
                  .order_by(col(ToolCall.step_seq).desc())).first()
    return f"{run_id}:{step}:{call_id}"


def is_retry(s: Session, run_id: str, call_id: str) -> bool:
    """The executing tool call was started before (its worker died, or the call was re-run)."""
    attempts = s.exec(select(ToolCall.attempts).where(ToolCall.run_id == run_id, ToolCall.call_id == call_id)
                      .order_by(col(ToolCall.step_seq).desc())).first()
    return (attempts or 0) > 1


def derived(kind: str, key: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"nanofleet:{kind}:{key}").hex
