"""A fault for the workers under test, loaded as a tool plugin (NANOFLEET_TOOLS__PLUGINS): while the
workspace holds BREAK_PROMPT, building a system prompt raises, so every LLM step fails before its
LLM call, as one did with an unreadable workspace file."""

from __future__ import annotations

from pydantic import BaseModel

from shared.agent import prompt
from shared.settings import Settings
from shared.tools.base import Tool, ToolContext, ToolResult

MARKER = "BREAK_PROMPT"
FAULT = "the system prompt is broken on purpose"


def _section(settings: Settings) -> str:
    if (settings.workspace / MARKER).exists():
        raise RuntimeError(FAULT)
    return ""


prompt.SECTIONS.append(_section)


class NoArgs(BaseModel):
    pass


class BreakerTool(Tool):
    """Never allowed; loading it puts the fault in place."""

    name = "breaker"
    description = "Breaks the system prompt (test fault)."
    Args = NoArgs

    async def run(self, args: NoArgs, ctx: ToolContext) -> ToolResult:
        return ToolResult.success("nothing")


PLUGIN = f"{__name__}:{BreakerTool.__name__}"
