"""Background work: subagents, cron jobs (Postgres, mirrored into redbeat), heartbeat, daily summary."""
