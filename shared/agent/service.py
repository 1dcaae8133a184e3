"""Entry points for new user messages, shared by the REST API, the channels and the CLI:
in-chat commands, the mailbox, and starting turns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, update
from sqlmodel import Session, col, select

from shared.agent import conversations, memory, prompt
from shared.agent.finish import cancel_conversation, publish_final
from shared.agent.runtime import Next, Runtime
from shared.constants import REPORT, T_AGENT_STEP, T_COMPACT
from shared.errors import Conflict, NotFound
from shared.models import Conversation, Message, MessageType, Role, Run

HELP = """Commands:
/new   - summarise this conversation and start a fresh session
/stop  - stop the running turn and its subagents
/model - show this chat's model; /model NAME switches to one of the operator's
/usage - the tokens and cost of this chat so far
/retry - answer the last message again (the answer it had is dropped); /retry TEXT: as if it said TEXT
/help  - this message"""
# Where a chat app keeps a leading "/" for commands of its own: how to send ours there
SENDING_COMMANDS = {
    "slack": "On Slack, send them after a mention of the bot (@bot /stop), or in a direct message after a space.",
    "discord": "On Discord, send them through /ask (question: /stop).",
}
NEW_WHILE_BUSY = "A reply is still being written: send /new again once it has come, or /stop it first."
DEFAULT = "default"
# The commands as chat apps list them in their menus (Telegram's, set with the webhook)
COMMANDS = {
    "new": "Summarise this conversation and start a fresh session",
    "stop": "Stop the running turn and its subagents",
    "model": "Show this chat's model, or switch it: /model NAME",
    "usage": "The tokens and cost of this chat so far",
    "retry": "Answer the last message again; /retry TEXT: as if it said TEXT",
    "help": "The commands",
}


@dataclass
class Submitted:
    """What became of a message: a command answered at once, a new turn, or a mailbox entry."""

    conversation_id: str
    message_id: int | None = None
    run_id: str | None = None
    reply: str | None = None  # set for commands
    nexts: list[Next] = field(default_factory=list)
    cancelled: list[Run] = field(default_factory=list)


def command_of(content: str) -> str:
    """The in-chat command a message is (`/stop`, any case), or ""."""
    return content.strip().split(maxsplit=1)[0].lower() if content.strip().startswith("/") else ""


def submit(
    rt: Runtime, s: Session, conversation_id: str, content: str, *, origin: dict[str, Any],
    model: str | None = None, images: list[dict[str, str]] | None = None,
) -> Submitted:
    """Handle one user message inside the caller's transaction; enqueue `nexts` after commit."""
    command = command_of(content)
    if command == "/help":
        how = SENDING_COMMANDS.get(str(origin.get("channel", "")))
        return Submitted(conversation_id, reply=f"{HELP}\n\n{how}" if how else HELP)
    if command == "/stop":
        out = Submitted(conversation_id)
        out.nexts = cancel_conversation(rt, s, conversation_id, out.cancelled)
        out.reply = f"Stopped {len(out.cancelled)} running task(s)." if out.cancelled else "Nothing is running."
        return out
    if command == "/model":
        return Submitted(conversation_id, reply=choose_model(rt, s, conversation_id, content.split()[1:]))
    if command == "/usage":
        return Submitted(conversation_id, reply=usage(s, conversation_id))
    if command == "/retry":
        try:
            edited = content.strip().split(maxsplit=1)[1:]  # "/retry TEXT": the last message as TEXT
            return answer_again(rt, s, conversation_id, content=edited[0] if edited else None,
                                origin=origin)  # answered where /retry was sent
        except Conflict as err:
            return Submitted(conversation_id, reply=f"Nothing to retry: {err.message}.")
    if command == "/new":
        try:
            started = memory.start_over(s, conversation_id)
        except conversations.Busy:
            return Submitted(conversation_id, reply=NEW_WHILE_BUSY)
        if not started:
            return Submitted(conversation_id, reply="Started a new session.")
        return Submitted(conversation_id, reply="Started a new session; I'll keep a summary of the last one.",
                         nexts=[Next(T_COMPACT, (conversation_id, True))])
    meta = {"origin": origin, **({"model": model} if model else {}),
            **({"sender": prompt.sender(origin)} if origin.get("group") else {})}
    posted = conversations.post_message(
        s, conversation_id, content, origin=origin, meta=meta, lease_seconds=rt.settings.runtime.lease_seconds,
        max_iterations=rt.settings.agent.max_iterations, images=images,
    )
    nexts = [Next(T_AGENT_STEP, (posted.run_id, 0))] if posted.run_id else []
    return Submitted(conversation_id, message_id=posted.message_id, run_id=posted.run_id, nexts=nexts)


def answer_again(rt: Runtime, s: Session, conversation_id: str, *, content: str | None = None,
                 model: str | None = None, origin: dict[str, Any] | None = None) -> Submitted:
    """/retry, and the API's regenerate: the conversation's last user message (its user's: not a
    subagent's report) answered afresh (with `content`, as edited), the answer and tool results of the
    turn that answered it dropped (not what came after from elsewhere: a report and its answer, a cron
    job's result); the message moves to
    the end of the transcript (a new seq) and into the new turn, whose model is `model`, else the
    message's own, and whose reply goes to `origin`, else where the message came from. Raises NotFound,
    or Conflict while a turn runs or when there is no message to answer again (none yet, or only ones a
    summary already holds)."""
    found = s.exec(select(Conversation.id, Conversation.active_run_id).where(Conversation.id == conversation_id)
                   .with_for_update(key_share=True)).first()  # FOR NO KEY UPDATE, as taking the turn does
    if found is None:
        raise NotFound(f"no conversation {conversation_id}")
    if found[1]:
        raise conversations.Busy([found[1]])
    last = s.exec(select(Message).where(Message.conversation_id == conversation_id, Message.role == Role.USER,
                                        Message.type == MessageType.NORMAL, col(Message.pending).is_(False),
                                        col(Message.meta)["kind"].astext.is_distinct_from(REPORT))
                  .order_by(col(Message.seq).desc()).limit(1)).first()
    if last is None or (last.seq or 0) <= prompt.covered(prompt.latest_summary(s, conversation_id, fresh=True)):
        raise Conflict("the conversation has no message to answer again since its last summary (or /new)"
                       if last else "the conversation has no message yet")
    answer = [col(Message.run_id) == last.run_id] if last.run_id else []  # (None: every message after it)
    s.execute(delete(Message).where(col(Message.conversation_id) == conversation_id, col(Message.seq) > last.seq,
                                    col(Message.type) == MessageType.NORMAL, col(Message.pending).is_(False), *answer))
    origin = origin or last.meta.get("origin") or {"channel": "api", "chat_id": conversation_id}
    run_id = conversations.try_start_turn(s, conversation_id, origin=origin,
                                          lease_seconds=rt.settings.runtime.lease_seconds,
                                          model=model or last.meta.get("model"),
                                          max_iterations=rt.settings.agent.max_iterations)
    assert run_id is not None  # the conversation's row is locked, and no turn was active
    # From now on it is answered where `origin` says (a channel tells nobody else it was answered).
    meta = {**last.meta, "origin": origin, **({"edited": True} if content is not None else {})}
    edited = {"content": content} if content is not None else {}
    s.execute(update(Message).where(col(Message.id) == last.id)
              .values(run_id=run_id, seq=func.nextval("message_seq"), meta=meta, **edited))
    return Submitted(conversation_id, message_id=last.id, run_id=run_id, nexts=[Next(T_AGENT_STEP, (run_id, 0))])


def choose_model(rt: Runtime, s: Session, conversation_id: str, args: list[str]) -> str:
    """/model: the chat's model, or with a name the one its turns use from now on (a message's own
    "model", from the API, still wins). A chat picks among the operator's profiles, or the default."""
    llm = rt.settings.llm
    choices = f"choices: {', '.join([DEFAULT, *sorted(llm.profiles)])}"
    if args:
        name = args[0]
        if name != DEFAULT and name not in llm.profiles:
            return f"There is no model {name!r} here; {choices}."
        conversations.set_model(s, conversation_id, None if name == DEFAULT else name)
        current: str | None = None if name == DEFAULT else name
    else:
        current = conversations.chosen_model(s, conversation_id)
    if current is None:
        return f"This chat uses the default model ({llm.model}); {choices}."
    if current not in llm.profiles:
        return f"This chat asked for {current!r}, which is no longer configured: send /model {DEFAULT}; {choices}."
    verb = "now uses" if args else "uses"
    return f"This chat {verb} {current} ({llm.profiles[current].model}); {choices}."


def usage(s: Session, conversation_id: str) -> str:
    """/usage: what the chat has used so far, its subagents' sessions included."""
    ids = conversations.family(s, conversation_id)
    prompt_tokens, completion_tokens, cost = s.exec(
        select(func.sum(Conversation.prompt_tokens), func.sum(Conversation.completion_tokens),
               func.sum(Conversation.cost)).where(col(Conversation.id).in_(ids))).one()
    subagents = f" (with {len(ids) - 1} subagent session(s))" if len(ids) > 1 else ""
    return (f"This chat so far{subagents}: {prompt_tokens or 0:,} prompt and {completion_tokens or 0:,} completion "
            f"tokens, {dollars(cost or 0.0)}.")


def dollars(cost: float) -> str:
    """A cost as people read it, down to a millionth of a dollar (a cheap model's whole chat may cost
    $0.000016, which four decimals showed as nothing)."""
    if cost == 0 or cost >= 1:
        return f"${cost:,.2f}"
    if cost < 1e-6:
        return "under $0.000001"
    return f"${cost:.4f}" if cost >= 1e-4 else f"${cost:.6f}"


def after_commit(rt: Runtime, submitted: Submitted) -> None:
    """Publish the end of runs a command cancelled (call once the transaction committed)."""
    for run in submitted.cancelled:
        publish_final(rt, run)
