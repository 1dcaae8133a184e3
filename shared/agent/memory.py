"""Memory: compaction into SUMMARY messages, and a token guard that fits the context window."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, cast, func, text
from sqlmodel import Session, col, select

from shared.agent import prompt
from shared.errors import Retryable
from shared.llm import LLMError
from shared.models import Conversation, Message, MessageType, Role
from shared.settings import MemorySettings

if TYPE_CHECKING:
    from shared.agent.runtime import Runtime

log = logging.getLogger(__name__)
RESERVE_TOKENS = 4096  # room for the answer
TRIM_CHARS = 2000

SUMMARY_PROMPT = """Summarise the conversation below for your own future reference. Keep facts,
decisions, names, open tasks and the user's preferences; drop chit-chat. Write at most 300 words.
{previous}
Conversation:
{transcript}"""


def _normal_after(s: Session, conversation_id: str, after_seq: Any) -> Any:
    return select(Message).where(
        Message.conversation_id == conversation_id,
        Message.type == MessageType.NORMAL,
        col(Message.pending).is_(False),
        col(Message.seq) > after_seq,
    )


def needs_compaction(s: Session, conversation_id: str, settings: MemorySettings) -> bool:
    """More NORMAL messages than `compact_after` since the latest summary (one query)."""
    latest = (
        select(cast(Message.meta[prompt.COVERS].astext, BigInteger))
        .where(Message.conversation_id == conversation_id, *prompt.IS_SUMMARY)
        .order_by(col(Message.seq).desc())
        .limit(1)
        .scalar_subquery()
    )
    covered = func.coalesce(latest, 0)
    count = s.exec(select(func.count()).select_from(_normal_after(s, conversation_id, covered).subquery())).one()
    return int(count) > settings.compact_after


def compact(rt: Runtime, conversation_id: str, *, everything: bool = False, keep: int | None = None) -> bool:
    """Summarise what the window no longer shows (or everything, for /new; or all but the last
    `keep` messages, the ones the token guard kept), up to the running turn; True if it wrote one."""
    with rt.session() as s:
        if not s.execute(text("select pg_try_advisory_xact_lock(hashtext(:c))"), {"c": conversation_id}).scalar():
            if everything:  # /new was promised: it runs after the automatic compaction holding the lock
                raise Retryable("another compaction of this conversation is running", delay=2, max_retries=60)
            return False
        summary = prompt.latest_summary(s, conversation_id)
        rows = list(s.exec(_normal_after(s, conversation_id, prompt.covered(summary)).order_by(col(Message.seq))))
        if everything:
            keep = 0
        elif keep is None:
            keep = rt.settings.memory.window
        old = rows[: len(rows) - keep] if keep else rows
        active = s.get_one(Conversation, conversation_id).active_run_id
        if active and not everything:  # the running turn's messages stay in its prompt whatever a summary says
            old = old[:next((i for i, m in enumerate(old) if m.run_id == active), len(old))]
        if not old:
            return False
        transcript = "\n".join(f"{m.role.value}: {m.content[:TRIM_CHARS]}" for m in old if m.content)
        previous = f"Previous summary:\n{summary.content}\n" if summary else ""
        try:
            response = rt.llm.complete(
                [{"role": "user", "content": SUMMARY_PROMPT.format(previous=previous, transcript=transcript)}]
            )
        except LLMError as err:  # an automatic compaction comes again with the next turn; /new is retried
            if everything:
                raise Retryable(f"summary for /new: {err}", max_retries=5) from err
            log.warning("compaction of %s failed: %s", conversation_id, err)
            return False
        covers = old[-1].seq or 0
        if summary is None:
            summary = Message(conversation_id=conversation_id, role=Role.SYSTEM, type=MessageType.SUMMARY)
        summary.content = response.content
        summary.meta = {**summary.meta, prompt.COVERS: covers, "reset": everything}
        s.add(summary)
        log.info("compacted %d messages of %s", len(old), conversation_id)
        return True


def fit(rt: Runtime, messages: list[dict[str, Any]], model: str | None,
        tools: list[dict[str, Any]] | None = None) -> tuple[list[dict[str, Any]], int | None]:
    """Trim the history so the prompt fits the model's context window, tool calls and the tools'
    schemas (sent with every call) counted. The newest user message (the request being answered)
    is never cut: older history goes first, then every message is shortened (`hard_trim` starts
    there), then the oldest tool rounds after the request. An assistant message and its tool
    results go or stay together. Returns the messages and, when history was cut, how many history
    messages were kept (the `summarize` strategy then compacts what was left out)."""
    profile = rt.llm.profile(model)
    budget = profile.context_window - (profile.max_tokens or RESERVE_TOKENS)
    if _bytes(messages) + _bytes(tools or []) <= budget or rt.llm.count_tokens(messages, model, tools) <= budget:
        return messages, None
    head = [m for m in messages[:2] if m["role"] == "system"]
    rounds, tail = _rounds(messages[len(head):-1]), messages[-1:]

    def fits() -> bool:
        return rt.llm.count_tokens(head + [m for r in rounds for m in r] + tail, model, tools) <= budget

    if rt.settings.memory.context_strategy == "hard_trim":
        rounds = [[_shorten(m) for m in r] for r in rounds]
    request = max((i for i, r in enumerate(rounds) if r[0]["role"] == "user"), default=len(rounds) - 1)
    while request > 0 and not fits():
        rounds.pop(0)
        request -= 1
    if not fits():
        rounds = [[_shorten(m) for m in r] for r in rounds]
    while len(rounds) > request + 2 and not fits():  # the request and the newest round stay
        rounds.pop(request + 1)
    body = [m for r in rounds for m in r]
    log.info("trimmed prompt to %d history messages to fit %d tokens", len(body), budget)
    return head + body + tail, len(body)


def _rounds(history: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The history in pieces that are cut whole: a message, or an assistant message with tool
    calls together with the tool results that answer it."""
    out: list[list[dict[str, Any]]] = []
    for m in history:
        if m["role"] == "tool" and out and out[-1][0].get("tool_calls"):
            out[-1].append(m)
        else:
            out.append([m])
    return out


def _bytes(messages: list[dict[str, Any]]) -> int:
    """An upper bound of the prompt's tokens, without a tokenizer: every token stands for at least
    one byte, and the JSON framing outweighs the per-message tokens."""
    return len(json.dumps(messages, ensure_ascii=False, default=str).encode())


def _shorten(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str) and len(content) > TRIM_CHARS:
        return {**message, "content": content[:TRIM_CHARS] + " [trimmed]"}
    return message
