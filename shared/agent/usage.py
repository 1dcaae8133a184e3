"""What a step's model call cost: its run_steps row, and the sums on its run and conversation."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import bindparam, func, insert, update
from sqlalchemy.dialects.postgresql import insert as upsert
from sqlmodel import Session

from shared.db import table_of
from shared.llm_types import LLMResponse
from shared.models import Conversation, Phase, Run, RunStep, utcnow

_STEPS, _CONVERSATIONS = table_of(RunStep), table_of(Conversation)
# Every LLM step writes these: Core statements built once (no ORM bulk machinery, no statement building)
_STEP = dict(
    run_id=bindparam("rid"), seq=bindparam("seq"), kind=Phase.LLM, model=bindparam("model"),
    prompt_tokens=bindparam("prompt"), completion_tokens=bindparam("completion"), cost=bindparam("cost"),
    elapsed_ms=bindparam("elapsed"), started_at=bindparam("started"), finished_at=bindparam("now"))
ADD_STEP = insert(_STEPS).values(**_STEP)
ADD_LATE_STEP = upsert(_STEPS).values(**_STEP).on_conflict_do_nothing(index_elements=["run_id", "seq"]).returning(
    _STEPS.c.id)
ADD_USAGE = update(_CONVERSATIONS).where(_CONVERSATIONS.c.id == bindparam("cid")).values(
    prompt_tokens=_CONVERSATIONS.c.prompt_tokens + bindparam("prompt"),
    completion_tokens=_CONVERSATIONS.c.completion_tokens + bindparam("completion"),
    cost=_CONVERSATIONS.c.cost + bindparam("cost"), last_active_at=func.now())


def add(s: Session, run: Run, response: LLMResponse, seq: int, elapsed_ms: float, *, late: bool = False) -> None:
    """Record the call of step `seq`. `late`: its run ended while the model answered (a cancel), and
    the call is paid for all the same; recorded once, however often the step ran."""
    u, now = response.usage, utcnow()
    usage = {"prompt": u.prompt_tokens, "completion": u.completion_tokens, "cost": u.cost}
    step = {"rid": run.id, "seq": seq, "model": response.model, "elapsed": elapsed_ms,
            "started": now - timedelta(milliseconds=elapsed_ms), "now": now, **usage}
    if late:
        if s.execute(ADD_LATE_STEP, step).first() is None:  # recorded by another run of the step
            return
    else:
        s.execute(ADD_STEP, step)
    s.execute(ADD_USAGE, {"cid": run.conversation_id, **usage})
    # The run's row is written once, with the rest of what this step changes in it.
    run.prompt_tokens += u.prompt_tokens
    run.completion_tokens += u.completion_tokens
    run.cost += u.cost
    s.add(run)
