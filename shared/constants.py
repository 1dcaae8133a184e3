"""Names shared by the gateway and the workers: queues, task names, Redis key prefixes."""

from __future__ import annotations

# Queues, declared explicitly (task_create_missing_queues=False).
Q_AGENT = "agent"
Q_TOOLS = "tools"
Q_SUBAGENTS = "subagents"
Q_OUTBOUND = "outbound"
Q_SCHEDULER = "scheduler"
QUEUES = (Q_AGENT, Q_TOOLS, Q_SUBAGENTS, Q_OUTBOUND, Q_SCHEDULER)
MODEL_QUEUES = (Q_AGENT, Q_SUBAGENTS)  # the queues whose tasks call the model (see TASK_ROUTES)

INTERNAL = "internal"  # the channel of sessions nobody chats in (cron jobs, subagents, the heartbeat)
EMPTY_ANSWER = "I've completed processing but have no response to give."  # for an answer with nothing to show
HEARTBEAT_QUIET = "HEARTBEAT_OK"  # a heartbeat run's answer when it has nothing to tell anyone

# Task names. Each prefix maps to one task module under workers/tasks and (but for two) to one queue.
T_PING = "nanofleet.scheduler.ping"
T_AGENT_STEP = "nanofleet.agent.step"
T_INGEST = "nanofleet.agent.ingest"  # submit the messages webhooks recorded
T_SUBAGENT_STEP = "nanofleet.subagents.step"
T_COMPACT = "nanofleet.agent.compact"
T_TOOL_EXECUTE = "nanofleet.tools.execute"
T_OUTBOUND_DELIVER = "nanofleet.outbound.deliver"
T_OUTBOUND_TYPING = "nanofleet.outbound.typing"
T_SWEEP = "nanofleet.scheduler.sweep"
T_CRON_FIRE = "nanofleet.scheduler.cron_fire"
T_HEARTBEAT = "nanofleet.scheduler.heartbeat"
T_DAILY_SUMMARY = "nanofleet.scheduler.daily_summary"
T_CRON_RECONCILE = "nanofleet.scheduler.cron_reconcile"
T_RETENTION = "nanofleet.scheduler.retention"

TASK_ROUTES = {
    # Beat starts these, but they wait on the model: on the scheduler queue they would hold up the
    # sweeper, cron and (in compose, where one worker takes both queues) reply delivery.
    T_HEARTBEAT: {"queue": Q_AGENT},
    T_DAILY_SUMMARY: {"queue": Q_AGENT},
    "nanofleet.agent.*": {"queue": Q_AGENT},
    "nanofleet.tools.*": {"queue": Q_TOOLS},
    "nanofleet.subagents.*": {"queue": Q_SUBAGENTS},
    "nanofleet.outbound.*": {"queue": Q_OUTBOUND},
    "nanofleet.scheduler.*": {"queue": Q_SCHEDULER},
}

# Redis keys. Everything the app writes lives under this prefix (Celery and redbeat keep theirs).
KEY_PREFIX = "nanofleet:"
KEY_EVENTS = KEY_PREFIX + "events:"  # + conversation id: a capped stream of run events
KEY_WATCH = KEY_PREFIX + "watch:"  # + conversation id: set while an SSE client reads its events
KEY_RATE = KEY_PREFIX + "rate:"  # + bucket name: shared rate limits for outbound sends
KEY_CACHE = KEY_PREFIX + "cache:"  # + name: small shared caches (platform access tokens)
KEY_UNDELIVERED = KEY_PREFIX + "undelivered:"  # + channel:message id: reported failed before the send was marked
KEY_SENT = KEY_PREFIX + "sent:"  # + outbox id: sent, but the database could not be told (see delivery)
REDBEAT_PREFIX = KEY_PREFIX + "redbeat:"
BEAT_LOCK = REDBEAT_PREFIX + ":lock"  # redbeat's lock: held (and renewed) while a beat runs
WORKER_ALIVE_FILE = "worker.alive"  # in the data dir: touched at each of a worker's heartbeats (workers/health.py)
BEAT_ALIVE_FILE = "beat.alive"  # in the data dir: touched as beat's scheduler ticks (workers/beat.py)

# Header that carries the request id from the gateway into Celery tasks and logs.
REQUEST_ID_HEADER = "request_id"
REPORT = "subagent_report"  # the meta kind of a subagent's report in its parent's conversation
