"""Start-up warnings for settings that load but are likely mistakes: allowed tool names that name no
tool, and platforms with some of their credentials set but not all (such a platform is off)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from shared.channels import REGISTRY
from shared.channels.base import BaseChannel
from shared.settings import Settings
from shared.tools.registry import is_allowed

log = logging.getLogger(__name__)
MCP_PREFIX = "mcp_"  # MCP tools are named mcp_<server>_<tool> (shared/tools/mcp/tool.py)


def unknown_allowed(settings: Settings, names: Iterable[str]) -> list[str]:
    """Entries of NANOFLEET_TOOLS__ALLOWED (names or globs) that match none of `names`. An `mcp_`
    entry is left out while a configured MCP server has listed no tools yet (it may be slow or
    down, and its tools appear when it comes up)."""
    known = set(names)
    unknown = [entry for entry in settings.tools.allowed if not any(is_allowed(n, [entry]) for n in known)]
    waiting = any(not any(n.startswith(f"{MCP_PREFIX}{server}_") for n in known)
                  for server in settings.tools.mcp_servers)
    return [e for e in unknown if not (waiting and e.startswith(MCP_PREFIX))]


def half_configured(settings: Settings) -> dict[str, list[str]]:
    """Platforms that are off although some of their credentials are set: name -> the variables
    still to set."""
    found = {}
    for name, factory in REGISTRY.items():
        channel = factory(settings)
        if not isinstance(channel, BaseChannel):  # all of them today; another kind says nothing here
            continue
        if (missing := channel.missing()) and channel.config.started(channel.required):
            found[name] = missing
    return found


def warn(settings: Settings, tool_names: Iterable[str]) -> None:
    """Log a WARNING for each likely mistake (the process starts anyway)."""
    known = sorted(set(tool_names))
    if unknown := unknown_allowed(settings, known):
        log.warning("NANOFLEET_TOOLS__ALLOWED: %s match no known tool, so nothing they name can run; known tools: %s",
                    ", ".join(repr(e) for e in unknown), ", ".join(known))
    for name, missing in half_configured(settings).items():
        log.warning("%s is off: some of its settings are set, but not %s (its webhook answers 404 until they are)",
                    name, ", ".join(missing))
