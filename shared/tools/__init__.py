"""Tools: the contract, the registry, and one file per built-in tool."""

from __future__ import annotations

import importlib

from shared.settings import Settings, SettingsError
from shared.tools.base import Tool
from shared.tools.registry import ToolRegistry
from shared.tools.time import TimeTool


def builtin_tools(settings: Settings) -> list[Tool]:
    """The built-in tools (each group can be switched off in settings)."""
    return [TimeTool()]


def plugin_tools(settings: Settings) -> list[Tool]:
    """Tools named in NANOFLEET_TOOLS__PLUGINS as "module:Class" (default-denied like any other)."""
    tools = []
    for spec in settings.tools.plugins:
        module, _, attr = spec.partition(":")
        if not attr:
            raise SettingsError(f"NANOFLEET_TOOLS__PLUGINS: '{spec}' must look like 'package.module:ToolClass'")
        try:
            tools.append(getattr(importlib.import_module(module), attr)())
        except (ImportError, AttributeError) as err:
            raise SettingsError(f"NANOFLEET_TOOLS__PLUGINS: cannot load '{spec}': {err}") from err
    return tools


def build_registry(settings: Settings) -> ToolRegistry:
    return ToolRegistry(settings, [*builtin_tools(settings), *plugin_tools(settings)])
