"""Rate limits shared by every worker: GCRA buckets in Redis, taken atomically by a Lua script.
A caller that must wait is told how long, so it can retry later instead of sleeping."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from shared.channels.base import Bucket
from shared.constants import KEY_RATE

# For each bucket: its theoretical arrival time (tat). A send is allowed when every bucket has
# tat - now <= interval * (burst - 1); then each tat moves on by one interval. All or nothing.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tats, wait = {}, 0
for i = 1, #KEYS do
  local interval, burst = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local tat = math.max(tonumber(redis.call('GET', KEYS[i]) or '0'), now)
  tats[i] = tat
  wait = math.max(wait, tat - now - interval * (burst - 1))
end
if wait > 0 then return tostring(wait) end
for i = 1, #KEYS do
  local new = tats[i] + tonumber(ARGV[2 * i - 1])
  redis.call('SET', KEYS[i], tostring(new), 'PX', math.ceil((new - now) * 1000) + 1000)
end
return '0'
"""

# The platform said 429: nobody sends through this bucket for `seconds`.
_PENALIZE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local until_ = now + tonumber(ARGV[1]) + tonumber(ARGV[2]) * (tonumber(ARGV[3]) - 1)
if tonumber(redis.call('GET', KEYS[1]) or '0') < until_ then
  redis.call('SET', KEYS[1], tostring(until_), 'PX', math.ceil((until_ - now) * 1000) + 1000)
end
return 1
"""


class Limiter:
    """Token buckets in Redis shared by all workers."""

    def __init__(self, client: redis.Redis) -> None:
        self._acquire = client.register_script(_ACQUIRE)
        self._penalize = client.register_script(_PENALIZE)

    def acquire(self, buckets: Sequence[Bucket]) -> float:
        """Take a token from every bucket and return 0, or take none and return the seconds to wait."""
        if not buckets:
            return 0.0
        args: list[float] = []
        for b in buckets:
            args += [b.interval, b.burst]
        return float(self._acquire(keys=[KEY_RATE + b.key for b in buckets], args=args))

    def penalize(self, bucket: Bucket, seconds: float) -> None:
        self._penalize(keys=[KEY_RATE + bucket.key], args=[seconds, bucket.interval, bucket.burst])
