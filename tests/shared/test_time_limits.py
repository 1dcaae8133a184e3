"""Celery's time limits (which a prefork pool enforces, as compose's tools worker runs) stay above
what the settings let a tool call or a model call take: a 600 s exec is not cut short at 300 s.
And the tasks beat starts that wait on the model run on the agent queue, not the scheduler's."""

from __future__ import annotations

from shared.constants import (
    T_AGENT_STEP,
    T_CRON_FIRE,
    T_DAILY_SUMMARY,
    T_HEARTBEAT,
    T_INGEST,
    T_OUTBOUND_DELIVER,
    T_SWEEP,
    T_TOOL_EXECUTE,
)
from shared.queueing import HARD_TIME_LIMIT, SOFT_TIME_LIMIT, make_celery
from shared.settings import Settings
from tests.support.tools import SleepTool
from workers.app import TASK_MODULES


class LongTool(SleepTool):
    """A plugin that declares its own timeout, longer than any setting's."""

    name = "long_sleep"
    timeout = 2000.0


def limits(settings: Settings) -> dict[str, tuple[float | None, float | None]]:
    """(soft, hard) seconds of each task, as a worker's pool reads them."""
    app = make_celery(settings, include=TASK_MODULES)
    app.loader.import_default_modules()
    app.finalize()
    return {name: (app.tasks[name].soft_time_limit or app.conf.task_soft_time_limit,
                   app.tasks[name].time_limit or app.conf.task_time_limit)
            for name in (T_TOOL_EXECUTE, T_AGENT_STEP, T_HEARTBEAT, T_INGEST, T_OUTBOUND_DELIVER)}


def test_tool_and_model_steps_get_the_time_their_settings_allow() -> None:
    settings = Settings.model_validate({
        "tools": {"exec": {"max_timeout": 900},
                  "mcp_servers": {"slow": {"url": "http://mcp.test/mcp", "timeout": 1200}}},
        "llm": {"timeout": 200, "max_retries": 2, "retry_max_delay": 10},
    })
    got = limits(settings)
    tool_soft, tool_hard = got[T_TOOL_EXECUTE]
    assert tool_soft is not None and tool_hard is not None
    assert 1200 < tool_soft < tool_hard  # the slowest tool: the MCP server's calls
    for task in (T_AGENT_STEP, T_HEARTBEAT, T_INGEST):  # a step, the heartbeat's decision, a voice message
        model_soft, _ = got[task]
        assert model_soft is not None and model_soft > 3 * 200 + 2 * 10  # every try at the timeout, every pause
    assert got[T_OUTBOUND_DELIVER] == (SOFT_TIME_LIMIT, HARD_TIME_LIMIT)


def test_with_short_timeouts_the_defaults_stay() -> None:
    settings = Settings.model_validate({"tools": {"exec": {"max_timeout": 30}},
                                        "llm": {"timeout": 10, "max_retries": 0}})
    assert set(limits(settings).values()) == {(SOFT_TIME_LIMIT, HARD_TIME_LIMIT)}


def test_a_plugin_tools_own_timeout_counts() -> None:
    settings = Settings.model_validate({"tools": {"plugins": [f"{__name__}:LongTool"]}})
    soft, hard = limits(settings)[T_TOOL_EXECUTE]
    assert soft is not None and hard is not None
    assert 2000 < soft < hard


def test_the_model_waits_of_scheduled_work_stay_off_the_scheduler_queue() -> None:
    """With 150 daily summaries queued on a 3 s model, a scheduler ping took 21 s: the sweeper, cron
    and compose's reply delivery waited behind them (helper's review)."""
    router = make_celery(Settings()).amqp.router
    tasks = (T_HEARTBEAT, T_DAILY_SUMMARY, T_SWEEP, T_CRON_FIRE)
    queue = {task: router.route({}, task)["queue"].name for task in tasks}
    assert queue == {T_HEARTBEAT: "agent", T_DAILY_SUMMARY: "agent", T_SWEEP: "scheduler", T_CRON_FIRE: "scheduler"}
