"""Memory: compaction into SUMMARY messages, and a token guard that fits the context window."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Integer, bindparam, cast, func, text
from sqlmodel import Session, col, select

from shared.agent import conversations, lease, prompt
from shared.errors import Retryable
from shared.llm_types import LLMError
from shared.models import IMAGES, Conversation, Message, MessageType, Role
from shared.settings import MemorySettings

if TYPE_CHECKING:
    from shared.agent.runtime import Runtime

log = logging.getLogger(__name__)
TRIM_CHARS = 2000
# What a photo is counted as: a high-detail tile grid of a phone photo costs about this much (OpenAI:
# 765 tokens at 1024x1024); the tokenizers' own counts want the pixels, or fail on a data URL.
IMAGE_TOKENS = 1000
CHARS_PER_TOKEN = 4  # about, in English: a first guess the tokenizer then checks
# A /new's summary row, until its summary is written: when its task was last sent (the sweep's cue),
# the end of the previous summary, and when /new was asked (the model is given GIVE_UP to answer).
DUE, FROM, ASKED = "summary_due", "summary_from", "summary_asked"
GIVE_UP = timedelta(hours=1)

SUMMARY_PROMPT = """Summarise the conversation below for your own future reference. Keep facts,
decisions, names, open tasks and the user's preferences; drop chit-chat. Write at most 300 words.
{previous}
Conversation:
{transcript}"""


def _normal_after(conversation_id: Any, after_seq: Any) -> Any:
    return select(Message).where(
        Message.conversation_id == conversation_id,
        Message.type == MessageType.NORMAL,
        col(Message.pending).is_(False),
        col(Message.seq) > after_seq,
    )


# Whether a conversation has more NORMAL messages than :limit - 1 since its latest summary (every run's
# end asks; built once): counts no further than that, so a long uncompacted history costs no more.
_COVERED = (select(cast(Message.meta[prompt.COVERS].astext, BigInteger))
            .where(Message.conversation_id == bindparam("cid"), *prompt.IS_SUMMARY)
            .order_by(col(Message.seq).desc()).limit(1).scalar_subquery())
_NEWER = (_normal_after(bindparam("cid"), func.coalesce(_COVERED, 0)).with_only_columns(Message.id)
          .limit(bindparam("limit", type_=Integer)))
_COUNT_NEWER = select(func.count()).select_from(_NEWER.subquery())


def needs_compaction(s: Session, conversation_id: str, settings: MemorySettings) -> bool:
    """More NORMAL messages than `compact_after` since the latest summary (one query)."""
    count = s.exec(_COUNT_NEWER, params={"cid": conversation_id, "limit": settings.compact_after + 1}).one()
    return int(count) > settings.compact_after


def start_over(s: Session, conversation_id: str) -> bool:
    """/new, in the caller's transaction: from the next prompt on, the history starts after the
    conversation's last message. The summary of what came before is written by a compaction task
    (`everything=True`); until it is, the summary row carries `DUE`, and `resend_summaries` sends
    the task again while it stays there (a lost enqueue, a worker that died, a model that was down).
    False when nothing was said since the last summary. Raises Busy while a turn runs: its answer,
    written later, would open the new session without its question."""
    active = s.exec(select(Conversation.active_run_id).where(Conversation.id == conversation_id)
                    .with_for_update()).first()
    if active:
        raise conversations.Busy([active])
    summary = prompt.latest_summary(s, conversation_id, fresh=True)
    last = s.exec(select(func.max(Message.seq)).where(
        Message.conversation_id == conversation_id, Message.type == MessageType.NORMAL,
        col(Message.pending).is_(False))).one()
    if not last or last <= prompt.covered(summary):
        return False
    if summary is None:
        summary = Message(conversation_id=conversation_id, role=Role.SYSTEM, type=MessageType.SUMMARY)
    meta = summary.meta
    now = lease.db_now(s).isoformat()
    summary.meta = {**meta, prompt.COVERS: last, FROM: meta.get(FROM, prompt.covered(summary)), "reset": True,
                    DUE: now, ASKED: now}
    s.add(summary)
    return True


def compact(rt: Runtime, conversation_id: str, *, everything: bool = False, keep: int | None = None) -> bool:
    """Summarise what the window no longer shows (or all but the last `keep` messages, the ones
    the token guard kept), up to the running turn; or, with `everything`, what a /new left behind.
    One compaction of a conversation at a time, under its lease, which the process renews while the
    model writes (a compaction whose worker died is taken up again within a lease: shared.agent.lease);
    no transaction stays open across the model call (it would hold locks that a migration waits
    for, and a pooled connection). True if it wrote a summary."""
    with lease.keeper(rt.settings.database_url, rt.settings.runtime.lease_seconds).compacting(conversation_id) as mine:
        if mine:
            return _compact(rt, conversation_id, everything=everything, keep=keep)
    if everything and _exists(rt, conversation_id):  # /new was promised: after the one holding the lease
        raise Retryable("another compaction of this conversation is running", delay=2, max_retries=60)
    return False


def _exists(rt: Runtime, conversation_id: str) -> bool:
    with rt.session() as s:
        return s.get(Conversation, conversation_id) is not None


def _compact(rt: Runtime, conversation_id: str, *, everything: bool, keep: int | None) -> bool:
    with rt.session() as s:  # read what to summarise, and commit
        summary = prompt.latest_summary(s, conversation_id)
        seen = (summary.id, dict(summary.meta)) if summary else None
        if everything:
            old = _left_behind(s, conversation_id, summary)
        elif summary is not None and DUE in summary.meta:
            return False  # the /new summary comes first; the next turn asks again
        else:
            old = _past_window(rt, s, conversation_id, summary, keep)
        if not old:
            return False
        previous = f"Previous summary:\n{summary.content}\n" if summary and summary.content else ""
    try:
        response = rt.llm.complete([_summary_request(rt, conversation_id, previous, old)])
        if not response.content.strip():  # stored, it would replace the summary there is: all of it forgotten
            raise LLMError(f"the model wrote an empty summary ({response.model})", user_message="")
    except LLMError as err:  # an automatic compaction comes again with the next turn
        if everything:
            return _failed_reset(rt, conversation_id, err)
        log.warning("compaction of %s failed: %s", conversation_id, err)
        return False
    with rt.session() as s:
        if not _store(s, conversation_id, response.content, old[-1].seq or 0, seen):
            return False
    log.info("compacted %d messages of %s", len(old), conversation_id)
    return True


def _photos(m: Message) -> str:
    """What a summary is told of a message's photos (it is not shown them)."""
    return f"[{m.meta[IMAGES]} photo(s)] " if m.meta.get(IMAGES) else ""


def _summary_request(rt: Runtime, conversation_id: str, previous: str, old: list[Message]) -> dict[str, Any]:
    """The request for a summary of `old`, cut to the newest messages that fit the model's context
    window: a backlog (compactions that failed for a while, a small local model) would otherwise be
    refused every time, and the summary never move on. What is cut is left out of the summary."""
    budget = rt.llm.prompt_budget()
    lines = [f"{m.role.value}: {_photos(m)}{prompt.said(m)[:TRIM_CHARS]}".rstrip()
             for m in old if m.content or m.meta.get(IMAGES)]

    def request(kept: list[str]) -> dict[str, Any]:
        return {"role": "user", "content": SUMMARY_PROMPT.format(previous=previous, transcript="\n".join(kept))}

    start, size = len(lines), len(SUMMARY_PROMPT) + len(previous)
    while start > 0 and size + len(lines[start - 1]) + 1 <= budget * CHARS_PER_TOKEN:  # a first guess...
        start -= 1
        size += len(lines[start]) + 1
    start = max(0, min(start, len(lines) - 1))  # the newest message at least: the tokenizer has the last word
    while start < len(lines) - 1 and rt.llm.count_tokens([request(lines[start:])]) > budget:  # ...made sure of
        start += max(1, (len(lines) - start) // 10)
    if start:
        log.warning("summary of %s: the %d oldest of %d messages do not fit the model's context window and are "
                    "left out", conversation_id, start, len(lines))
    return request(lines[start:])


def _store(s: Session, conversation_id: str, content: str, covers: int, seen: tuple[int | None, Any] | None) -> bool:
    """Write the summary of everything up to `covers`. A /new may have moved the summary's bounds
    while the model wrote it: under the conversation's lock (which /new takes), look again. An
    automatic compaction overtaken by a /new is dropped: its summary would move the cut back, and
    so is one of a conversation deleted meanwhile."""
    if not _lock(s, conversation_id):
        return False
    summary = prompt.latest_summary(s, conversation_id, fresh=True)
    if summary is not None and DUE in summary.meta:
        if seen is None or DUE not in seen[1]:
            return False
        _written(summary, covers)
    elif ((summary.id, summary.meta) if summary else None) != seen:
        return False
    else:
        summary = summary or Message(conversation_id=conversation_id, role=Role.SYSTEM, type=MessageType.SUMMARY)
        summary.meta = {**summary.meta, prompt.COVERS: covers, "reset": False}
    summary.content = content
    s.add(summary)
    return True


def _lock(s: Session, conversation_id: str) -> bool:
    """The conversation's row lock: /new and the end of a compaction change its summary under it
    (and a deletion takes it). False when the conversation is gone."""
    found = s.execute(select(Conversation.id).where(Conversation.id == conversation_id).with_for_update())
    return found.first() is not None


def _left_behind(s: Session, conversation_id: str, summary: Message | None) -> list[Message]:
    """What a /new still waits to have summarised; none when its summary is written (a /new with
    nothing to summarise is marked written here)."""
    if summary is None or DUE not in summary.meta:
        return []
    rows = list(s.exec(_normal_after(conversation_id, int(summary.meta.get(FROM, 0)))
                       .where(col(Message.seq) <= prompt.covered(summary)).order_by(col(Message.seq))))
    if not rows:
        _written(summary, prompt.covered(summary))
        s.add(summary)
    return rows


def _past_window(rt: Runtime, s: Session, conversation_id: str, summary: Message | None,
                 keep: int | None) -> list[Message]:
    """The messages an automatic compaction summarises: all but the last `keep`, and none of the
    running turn's (they stay in its prompt whatever a summary says)."""
    rows = list(s.exec(_normal_after(conversation_id, prompt.covered(summary)).order_by(col(Message.seq))))
    keep = rt.settings.memory.window if keep is None else keep
    old = rows[: len(rows) - keep] if keep else rows
    active = s.get_one(Conversation, conversation_id).active_run_id
    if active:
        old = old[:next((i for i, m in enumerate(old) if m.run_id == active), len(old))]
    return old


def _written(summary: Message, covers: int) -> None:
    """The /new summary now stands for everything up to `covers`: done, unless a later /new moved
    its end further (then the rest is still due)."""
    if covers >= prompt.covered(summary):
        summary.meta = {k: v for k, v in summary.meta.items() if k not in (DUE, FROM, ASKED)}
    else:
        summary.meta = {**summary.meta, FROM: covers}


def _failed_reset(rt: Runtime, conversation_id: str, err: LLMError) -> bool:
    """The model failed the /new summary: the sweep sends it again `requeue_grace` later (stamped
    now; the sweep is its only re-sender, so attempts never pile up), for GIVE_UP after the latest
    /new; then the new session keeps the previous summary, and the messages between are left out."""
    with rt.session() as s:
        summary = prompt.latest_summary(s, conversation_id, fresh=True) if _lock(s, conversation_id) else None
        if summary is None or DUE not in summary.meta:
            return False
        asked, now = summary.meta.get(ASKED), lease.db_now(s)
        if asked is not None and now - datetime.fromisoformat(asked) >= GIVE_UP:
            log.error("gave up the /new summary of %s after %s: %s", conversation_id, GIVE_UP, err)
            _written(summary, prompt.covered(summary))
        else:
            log.warning("the /new summary of %s failed (%s); the sweeper tries again", conversation_id, err)
            summary.meta = {**summary.meta, DUE: now.isoformat()}
        s.add(summary)
    return False


# /new summaries whose task went missing: due for `grace` s and no compaction of the conversation
# running (its lease is free). Stamped, so the next sweeps leave them alone for `grace` s.
_DUE = text("""
update messages m set meta = jsonb_set(m.meta, '{summary_due}', to_jsonb(now()))
from (
  select m.id from messages m join conversations c on c.id = m.conversation_id
  where m.type = 'SUMMARY' and m.meta ? 'summary_due'
    and (m.meta->>'summary_due')::timestamptz < now() - make_interval(secs => :grace)
    and (cast(:cid as text) is null or m.conversation_id = :cid)
    and (c.compacting_until is null or c.compacting_until < now())
  limit :batch for update of m skip locked
) due
where m.id = due.id
returning m.conversation_id
""")


def resend_summaries(rt: Runtime, conversation_id: str | None = None) -> list[str]:
    """A sweep (over one conversation only: `nanofleet agent`): the conversations whose /new summary
    is due again."""
    params = {"grace": rt.settings.runtime.requeue_grace, "batch": 200, "cid": conversation_id}
    with rt.session() as s:
        ids = list(s.execute(_DUE, params).scalars())
    if ids:
        log.info("re-sending the /new summary of %d conversation(s)", len(ids))
    return ids


def fit(rt: Runtime, messages: list[dict[str, Any]], model: str | None,
        tools: list[dict[str, Any]] | None = None) -> tuple[list[dict[str, Any]], int | None]:
    """Trim the history so the prompt fits the model's context window, tool calls and the tools'
    schemas (sent with every call) counted. The newest user message (the request being answered)
    is kept whole while anything else can give way: older history goes first, then every other
    message is shortened, its start and end kept, to less and less (`hard_trim` starts at the least),
    then the request itself (its photos' caption too), then the oldest tool rounds after it. An
    assistant message and its tool results go or stay together. Returns the messages and, when
    history was cut, how many history messages were kept (the `summarize` strategy then compacts
    what was left out)."""
    budget = rt.llm.prompt_budget(model)
    if _bytes(messages) + _bytes(tools or []) <= budget or _tokens(rt, messages, model, tools) <= budget:
        return messages, None
    head = [m for m in messages[:2] if m["role"] == "system"]
    rounds, tail = _rounds(messages[len(head):-1]), messages[-1:]

    def fits() -> bool:
        sent = head + [m for r in rounds for m in r] + tail
        return _bytes(sent) + _bytes(tools or []) <= budget or _tokens(rt, sent, model, tools) <= budget

    request = max((i for i, r in enumerate(rounds) if r[0]["role"] == "user"), default=len(rounds) - 1)

    def shorten(limit: int, request_too: bool = False) -> list[list[dict[str, Any]]]:
        return [r if i == request and not request_too else [_shorten(m, limit) for m in r]
                for i, r in enumerate(rounds)]

    if rt.settings.memory.context_strategy == "hard_trim":
        rounds = shorten(TRIM_CHARS)
    while request > 0 and not fits():
        rounds.pop(0)
        request -= 1
    for request_too in (False, True):
        for limit in _limits(budget):
            if fits():
                break
            rounds = shorten(limit, request_too)
    while len(rounds) > request + 2 and not fits():  # the request and the newest round stay
        rounds.pop(request + 1)
    body = [m for r in rounds for m in r]
    log.info("trimmed prompt to %d history messages to fit %d tokens", len(body), budget)
    return head + body + tail, len(body)


def _limits(budget: int) -> Iterator[int]:
    """The lengths long messages are cut to, one after another until the prompt fits: from half the
    budget's worth of characters down to TRIM_CHARS."""
    limit = budget * CHARS_PER_TOKEN // 2
    while limit > TRIM_CHARS:
        yield limit
        limit //= 4
    yield TRIM_CHARS


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
    one byte, and the JSON framing outweighs the per-message tokens (a photo counts IMAGE_TOKENS)."""
    text, images = _without_images(messages)
    return len(json.dumps(text, ensure_ascii=False, default=str).encode()) + images * IMAGE_TOKENS


def _tokens(rt: Runtime, messages: list[dict[str, Any]], model: str | None,
            tools: list[dict[str, Any]] | None) -> int:
    text, images = _without_images(messages)
    return rt.llm.count_tokens(text, model, tools) + images * IMAGE_TOKENS


def _without_images(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The messages with their photos left out, and how many there were."""
    out, images = [], 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            shown = [part for part in content if part.get("type") != "image_url"]
            images += len(content) - len(shown)
            m = {**m, "content": shown}
        out.append(m)
    return out, images


def _shorten(message: dict[str, Any], limit: int) -> dict[str, Any]:
    """The message with its text (a photo's caption too) cut to about `limit` characters."""
    content = message.get("content")
    if isinstance(content, str) and len(content) > limit:
        return {**message, "content": _cut(content, limit)}
    if isinstance(content, list):
        return {**message, "content": [{**part, "text": _cut(part["text"], limit)}
                                       if len(part.get("text") or "") > limit else part for part in content]}
    return message


def _cut(text: str, limit: int) -> str:
    """The start and the end of `text` (where a tool's result says how to read on) in about `limit` characters."""
    end = limit // 4
    return f"{text[:limit - end]} [... {len(text) - limit} characters trimmed ...] {text[-end:]}"
