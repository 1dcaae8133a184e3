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


def derived(kind: str, key: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"nanofleet:{kind}:{key}").hex
