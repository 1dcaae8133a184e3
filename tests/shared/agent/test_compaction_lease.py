"""A compaction on real Postgres, in-process: it holds the conversation's lease, not a transaction,
while the model writes the summary; one runs at a time; the lease is renewed while the model
writes, and a dead worker's runs out within a lease."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from sqlalchemy import text

from shared.agent import conversations, memory, prompt
from shared.agent.runtime import Runtime
from shared.errors import Retryable
from shared.models import Conversation
from tests.shared.agent.test_new_session import _chat, _new, _summary
from tests.support.databases import locks_for_a_migration
from tests.support.processes import Proc, wait_until
from tests.support.stack import Stack

# A worker whose model call never returns: it holds the compaction lease until it is killed.
HANGING = """
import sys, threading
from shared.agent import memory
from shared.agent.runtime import Runtime
from shared.settings import load_settings
rt = Runtime.build(load_settings())
def hang(*args, **kwargs):
    print("the model is writing", flush=True)
    threading.Event().wait()
rt.llm.complete = hang
memory.compact(rt, sys.argv[1])
"""


def _lease(rt: Runtime, cid: str, seconds: float | None) -> None:
    """Set the conversation's compaction lease to run out `seconds` from now (None: free)."""
    with rt.session() as s:
        s.execute(text("update conversations set compacting_until = now() + make_interval(secs => :s) "
                       "where id = :c"), {"s": seconds, "c": cid})


def _held(rt: Runtime, cid: str) -> bool:
    with rt.session() as s:
        return s.get_one(Conversation, cid).compacting_until is not None


def _lease_now(rt: Runtime, cid: str) -> tuple[Any, float | None]:
    """The conversation's compaction lease, and the seconds it has left on Postgres's clock."""
    with rt.session() as s:
        until, left = s.execute(text("select compacting_until, extract(epoch from compacting_until - now()) "
                                     "from conversations where id = :c"), {"c": cid}).one()
    return until, None if left is None else float(left)


def test_no_transaction_stays_open_while_the_model_writes_the_summary(stack: Stack) -> None:
    """A summary can take a minute: its compaction used to keep a transaction open meanwhile, whose
    locks made a migration's ALTER TABLE wait (and then everything queued behind the ALTER)."""
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 30)
    complete, seen = rt.llm.complete, []

    def migrate_meanwhile(*args: Any, **kwargs: Any) -> Any:
        seen.append(locks_for_a_migration(stack.settings.database_url))
        return complete(*args, **kwargs)

    rt.llm.complete = migrate_meanwhile  # type: ignore[method-assign]
    assert memory.compact(rt, cid) is True
    assert seen == ["free"]
    assert "answer 19" in _summary(rt, cid).content and not _held(rt, cid)


def test_one_compaction_of_a_conversation_at_a_time(stack: Stack) -> None:
    """Another compaction of the same conversation while the model writes: an automatic one gives
    way at once, without a model call; a /new one is retried later (it was promised)."""
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 30)
    complete, calls, beside = rt.llm.complete, [], []

    def count(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            beside.append(memory.compact(rt, cid))
            with pytest.raises(Retryable, match="another compaction"):
                memory.compact(rt, cid, everything=True)
        return complete(*args, **kwargs)

    rt.llm.complete = count  # type: ignore[method-assign]
    assert memory.compact(rt, cid) is True
    assert beside == [False] and len(calls) == 1 and not _held(rt, cid)


def test_a_lease_left_by_a_dead_worker_runs_out(stack: Stack) -> None:
    """A worker killed in the middle of a compaction leaves its lease: the conversation is not
    compacted, nor its /new summary sent again, until the lease runs out; then both go ahead."""
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 30)
    _lease(rt, cid, 600)
    assert memory.compact(rt, cid) is False
    _new(rt, cid)
    with rt.session() as s:
        s.execute(text("update messages set meta = jsonb_set(meta, '{summary_due}', "
                       "to_jsonb(now() - interval '1 hour')) where type = 'SUMMARY'"))
    assert memory.resend_summaries(rt) == []
    _lease(rt, cid, -1)
    assert memory.resend_summaries(rt) == [cid]
    assert memory.compact(rt, cid, everything=True) is True
    assert memory.DUE not in _summary(rt, cid).meta and prompt.covered(_summary(rt, cid)) > 0
    assert not _held(rt, cid)


def test_a_failed_compaction_frees_its_lease(stack: Stack) -> None:
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 30)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a fault in the client")

    rt.llm.complete = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        memory.compact(rt, cid)
    assert not _held(rt, cid)


def test_a_conversation_deleted_while_its_summary_is_written_is_left_deleted(stack: Stack) -> None:
    """The model call holds no lock, so a DELETE may go through meanwhile: the summary is dropped
    (its write failed on the foreign key), and a /new summary of a conversation gone is not retried."""
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 30)
    complete = rt.llm.complete

    def deleted_meanwhile(*args: Any, **kwargs: Any) -> Any:
        with rt.session() as s:
            conversations.delete_conversation(s, cid)
        return complete(*args, **kwargs)

    rt.llm.complete = deleted_meanwhile  # type: ignore[method-assign]
    assert memory.compact(rt, cid) is False
    assert memory.compact(rt, cid, everything=True) is False
    with rt.session() as s:
        assert s.get(Conversation, cid) is None


def test_a_compaction_whose_worker_died_is_taken_up_again_within_a_lease(stack: Stack) -> None:
    """The lease was sized for the longest model call (every retry at its timeout: 10.5 minutes by
    default), so a worker killed in a compaction blocked that conversation's compactions that long."""
    rt = Runtime.build(stack.settings)
    cid = _chat(rt, 30)
    worker = Proc([sys.executable, "-c", HANGING, cid], stack.env, stack.log_dir / "hanging-compaction.log")
    try:
        wait_until(lambda: "the model is writing" in worker.log(), timeout=30, message="the compaction to start")
        assert memory.compact(rt, cid) is False  # it holds the lease
    finally:
        worker.kill()
    wait_until(lambda: memory.compact(rt, cid), timeout=10 * stack.settings.runtime.lease_seconds, interval=0.2,
               message="the dead worker's compaction lease to run out")
    assert "answer 19" in _summary(rt, cid).content and not _held(rt, cid)


def test_a_summary_that_takes_longer_than_a_lease_keeps_it(stack: Stack) -> None:
    """While the model writes, the lease is renewed: no other compaction starts, however long the
    model takes, and the lease is freed at the end whatever it was renewed to."""
    rt = Runtime.build(stack.settings)
    lease_seconds = stack.settings.runtime.lease_seconds
    cid = _chat(rt, 30)
    complete, beside, leases = rt.llm.complete, [], set()

    def renewed() -> bool:
        until, left = _lease_now(rt, cid)
        assert left is not None and 0 < left <= lease_seconds + 1, left  # a lease ahead, on Postgres's clock
        leases.add(until)
        return len(leases) > 3

    def slow(*args: Any, **kwargs: Any) -> Any:
        wait_until(renewed, timeout=10 * lease_seconds, message="the lease to be renewed three times")
        beside.append(memory.compact(rt, cid))
        return complete(*args, **kwargs)

    rt.llm.complete = slow  # type: ignore[method-assign]
    assert memory.compact(rt, cid) is True
    assert beside == [False] and not _held(rt, cid)
