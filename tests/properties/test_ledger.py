"""The inbound ledger under any delivery pattern: however a platform repeats and reorders its
webhook deliveries (sequentially or at the same moment), each event is recorded exactly once, before
the 200, and its message submitted exactly once by a worker. Real gateway over HTTP, real Postgres
and worker (tests/support/platforms.py)."""

from __future__ import annotations

import itertools
import uuid
from concurrent.futures import ThreadPoolExecutor

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.platforms import ChannelStack
from tests.support.processes import wait_until

_ids = itertools.count(7_000_000 + uuid.uuid4().int % 1_000_000 * 100)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(copies=st.lists(st.integers(1, 4), min_size=1, max_size=5), data=st.data(), together=st.booleans())
def test_each_telegram_update_is_stored_once(channels: ChannelStack, copies: list[int], data: st.DataObject,
                                             together: bool) -> None:
    d = channels.driver("telegram")
    chat = d.new_chat()
    events = [(next(_ids), f"ledger-{uuid.uuid4().hex[:10]}") for _ in copies]
    deliveries = data.draw(st.permutations([e for e, n in zip(events, copies, strict=True) for _ in range(n)]))

    def post(event: tuple[int, str]) -> int:
        return channels.post("telegram", d.request(chat=chat, text=event[1], event_id=str(event[0]))).status_code

    if together:
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(post, deliveries))
    else:
        codes = [post(e) for e in deliveries]
    assert codes == [200] * len(deliveries)
    for event_id, _ in events:  # recorded before the 200
        assert channels.scalar("select count(*) from inbound_events where channel = 'telegram' and event_id = :e",
                               e=str(event_id)) == 1
    for event_id, marker in events:
        wait_until(lambda e=str(event_id): channels.scalar(
            "select count(*) from inbound_events where event_id = :e and message is null", e=e),
            message="the message's submission")
        assert channels.scalar("select count(*) from messages where role = 'USER' and content = :m", m=marker) == 1
