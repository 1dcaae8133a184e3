"""Run events for the SSE stream: a capped Redis stream per conversation. Text deltas are only
streamed while a client watches (an SSE reader keeps a watch key alive): nobody else shows them,
and a streamed LLM call costs more CPU than a plain one. Deltas are sent in pieces at most every
DELTA_EVERY seconds: a write per token would be a thousand writes for a long answer, and would push
the run's other events out of the capped stream."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis
import redis.asyncio as aioredis

from shared.constants import KEY_EVENTS, KEY_WATCH

log = logging.getLogger(__name__)
STREAM_MAXLEN = 2000
# A conversation's stream goes this long after its last event: enough for any SSE client to resume,
# and Redis does not keep a stream for every conversation there ever was (the messages stay).
STREAM_TTL = 24 * 3600  # seconds

RUN_STARTED = "run.started"
STEP_STARTED = "step.started"
TEXT_DELTA = "text.delta"
TOOL_STARTED = "tool.started"
TOOL_PROGRESS = "tool.progress"
TOOL_FINISHED = "tool.finished"
RUN_FINISHED = "run.finished"
RUN_FAILED = "run.failed"
FINAL = (RUN_FINISHED, RUN_FAILED)
DELETED = "conversation.deleted"  # the stream's last event: SSE readers end their stream
DELETED_LINGER = 60  # seconds a deleted conversation's stream stays, for readers between two reads
DELTA_EVERY = 0.05  # seconds
ENDED_EVERY = 1.0  # seconds between looks at whether a streaming run was stopped
WATCH_SECONDS = 45  # outlives one blocking read of the SSE loop (15 s) with room to spare


def stream_key(conversation_id: str) -> str:
    return KEY_EVENTS + conversation_id


def watch_key(conversation_id: str) -> str:
    return KEY_WATCH + conversation_id


async def watch(client: aioredis.Redis, conversation_id: str) -> None:
    """Mark the conversation watched for a while (an SSE reader calls this before every read)."""
    await client.set(watch_key(conversation_id), "1", ex=WATCH_SECONDS)


Event = tuple[str, dict[str, str]]  # (stream entry id, {"event": ..., "data": json})


async def read(client: aioredis.Redis, conversation_id: str, since: str, block_ms: int) -> list[Event]:
    """Events after `since` (a stream id, or "$" for new ones only), waiting up to `block_ms`."""
    batches: Any = await client.xread({stream_key(conversation_id): since}, block=block_ms, count=100)
    return [(str(entry_id), dict(fields)) for _, entries in batches for entry_id, fields in entries]


class EventSink(Protocol):
    def publish(self, conversation_id: str, event: str, data: dict[str, Any]) -> None: ...

    def publish_watched(self, conversation_id: str, events: list[tuple[str, dict[str, Any]]]) -> bool: ...


class NullEvents:
    """Drops events (the in-process `nanofleet agent` has no listeners)."""

    def publish(self, conversation_id: str, event: str, data: dict[str, Any]) -> None:
        return None

    def publish_watched(self, conversation_id: str, events: list[tuple[str, dict[str, Any]]]) -> bool:
        return False


class RedisEvents:
    """Appends events to the conversation's stream; losing one never fails a run."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def publish(self, conversation_id: str, event: str, data: dict[str, Any]) -> None:
        self._publish(conversation_id, [(event, data)], ask=False)

    def publish_watched(self, conversation_id: str, events: list[tuple[str, dict[str, Any]]]) -> bool:
        """Publish `events`, and say whether an SSE client reads the conversation's events (then text
        deltas are streamed): one round trip, as a step starts."""
        return self._publish(conversation_id, events, ask=True)

    def _publish(self, conversation_id: str, events: list[tuple[str, dict[str, Any]]], *, ask: bool) -> bool:
        key = stream_key(conversation_id)
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for event, data in events:
                    pipe.xadd(key, {"event": event, "data": json.dumps(data, default=str)}, maxlen=STREAM_MAXLEN,
                              approximate=True)
                pipe.expire(key, STREAM_TTL)
                if ask:
                    pipe.exists(watch_key(conversation_id))
                answers = pipe.execute()
            return ask and bool(answers[-1])
        except redis.RedisError as err:
            log.warning("could not publish %s: %s", ", ".join(e for e, _ in events), err)
            return False

    def end(self, conversation_ids: list[str]) -> None:
        """Mark the conversations' streams deleted and let them go shortly after (raises RedisError)."""
        with self.client.pipeline(transaction=False) as pipe:
            for cid in conversation_ids:
                pipe.xadd(stream_key(cid), {"event": DELETED, "data": "{}"})
                pipe.expire(stream_key(cid), DELETED_LINGER)
            pipe.execute()


class Deltas:
    """A run's streamed text, published as it comes but at most every DELTA_EVERY seconds (the
    first piece at once); `flush` sends what is left when the call ends. With `ended` (whether the
    run has ended, asked at most every ENDED_EVERY seconds), a run stopped meanwhile streams no
    more: the model call goes on, and its text would follow the run's end."""

    def __init__(self, sink: EventSink, conversation_id: str, run_id: str,
                 ended: Callable[[], bool] | None = None) -> None:
        self.sink, self.conversation_id, self.run_id = sink, conversation_id, run_id
        self.pending: list[str] = []
        self.sent_at = 0.0
        self.ended, self.asked_at, self.stopped = ended, time.monotonic(), False

    def __call__(self, text: str) -> None:
        self.pending.append(text)
        if time.monotonic() - self.sent_at >= DELTA_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.pending and not self._run_ended():
            self.sink.publish(self.conversation_id, TEXT_DELTA, {"run_id": self.run_id, "text": "".join(self.pending)})
            self.sent_at = time.monotonic()
        self.pending.clear()

    def _run_ended(self) -> bool:
        if self.ended is not None and not self.stopped and time.monotonic() - self.asked_at >= ENDED_EVERY:
            self.asked_at = time.monotonic()
            try:
                self.stopped = self.ended()
            except Exception as err:  # the text goes on: only the look-up failed
                log.debug("run %s: cannot look up whether it ended: %s", self.run_id, err)
        return self.stopped
