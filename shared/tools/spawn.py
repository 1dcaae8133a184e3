"""`spawn`: start a background subagent for a task; it reports back in this conversation when done."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field

from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult

NO_NUL = r"^[^\x00]*$"


class SpawnArgs(BaseModel):
    task: str = Field(min_length=1, max_length=20_000, pattern=NO_NUL,
                      description="what the subagent should do, self-contained")
    label: str | None = Field(default=None, max_length=80, pattern=NO_NUL, description="a short name for the task")


class SpawnTool(Tool):
    """Creates a child run of kind subagent and returns at once with its id."""

    name = "spawn"
    description = (
        "Start a background subagent for a longer, self-contained task. Returns at once; the result is "
        "reported back in this conversation when the subagent finishes. Subagents cannot message users, "
        "spawn others or schedule jobs."
    )
    Args = SpawnArgs
    group = "scheduling"
    timeout = 30.0
    # Safe to run again: the child's id derives from this tool call, so a re-run finds the same child.
    idempotent = True

    async def run(self, args: SpawnArgs, ctx: ToolContext) -> ToolResult:
        from shared.scheduling import subagents  # imports the agent core, which imports the tools

        if ctx.run_kind == "subagent":
            return ToolResult.fail(ErrorCode.NOT_ALLOWED, "subagents cannot spawn other subagents")
        try:
            spawned = await asyncio.to_thread(
                subagents.spawn, ctx.settings, parent_run_id=ctx.run_id, call_id=ctx.call_id,
                task=args.task, label=args.label,
            )
        except subagents.LimitReached as err:
            return ToolResult.fail(ErrorCode.NOT_ALLOWED, f"{err}; wait for one to finish, or cancel one")
        except subagents.ParentStopped as err:
            return ToolResult.fail(ErrorCode.NOT_ALLOWED, str(err))
        except subagents.ParentBusy as err:
            return ToolResult.fail(ErrorCode.FAILED, str(err), retryable=True)
        ctx.followups.append(subagents.first_step(spawned.run_id))
        return ToolResult.success({
            "subagent_id": spawned.run_id,
            "label": spawned.label,
            "status": "started",
            "message": f"Started subagent '{spawned.label}'. It works in the background and I'll report back "
                       "here when it finishes.",
        })
