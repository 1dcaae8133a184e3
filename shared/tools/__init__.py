"""Tools: the contract, the registry, and one file per built-in tool."""

from __future__ import annotations

import importlib

from shared import startup_checks
from shared.settings import Settings, SettingsError
from shared.tools import mcp
from shared.tools.base import Tool
from shared.tools.cron import CronTool
from shared.tools.edit_file import EditFileTool
from shared.tools.exec import ExecTool
from shared.tools.http_get import HttpGetTool
from shared.tools.list_dir import ListDirTool
from shared.tools.message import MessageTool
from shared.tools.read_file import ReadFileTool
from shared.tools.registry import ToolRegistry
from shared.tools.spawn import SpawnTool
from shared.tools.time import TimeTool
from shared.tools.web_fetch import WebFetchTool
from shared.tools.web_search import WebSearchTool
from shared.tools.write_file import WriteFileTool


def builtin_tools(settings: Settings) -> list[Tool]:
    """The built-in tools, one file each (a group switched off in settings drops its tools)."""
    return [
        TimeTool(),
        ReadFileTool(),
        WriteFileTool(),
        EditFileTool(),
        ListDirTool(),
        ExecTool(),
        WebSearchTool(),
        WebFetchTool(),
        HttpGetTool(),
        MessageTool(),
        SpawnTool(),
        CronTool(),
    ]


def load_plugin(spec: str) -> type[Tool]:
    """The Tool class a NANOFLEET_TOOLS__PLUGINS entry names ("package.module:ToolClass"). Whatever
    keeps it from loading (importing a plugin runs its code, which may raise anything) is a
    SettingsError naming the entry and the error."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise SettingsError(f"NANOFLEET_TOOLS__PLUGINS: '{spec}' must look like 'package.module:ToolClass'")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except Exception as err:
        raise SettingsError(f"NANOFLEET_TOOLS__PLUGINS: cannot load '{spec}': {type(err).__name__}: {err}") from err
    if not (isinstance(cls, type) and issubclass(cls, Tool)):
        raise SettingsError(f"NANOFLEET_TOOLS__PLUGINS: '{spec}' is not a Tool class (a subclass of "
                            "shared.tools.base.Tool)")
    return cls


def plugin_classes(settings: Settings) -> list[type[Tool]]:
    """The classes named in NANOFLEET_TOOLS__PLUGINS as "module:Class" (SettingsError at the first
    that does not load)."""
    return [load_plugin(spec) for spec in settings.tools.plugins]


def plugin_tools(settings: Settings) -> list[Tool]:
    """Tools named in NANOFLEET_TOOLS__PLUGINS (default-denied like any other)."""
    tools = []
    for spec, cls in zip(settings.tools.plugins, plugin_classes(settings), strict=True):
        try:
            tools.append(cls())
        except Exception as err:
            raise SettingsError(f"NANOFLEET_TOOLS__PLUGINS: cannot create '{spec}': {type(err).__name__}: "
                                f"{err}") from err
    return tools


def check_plugins(settings: Settings) -> None:
    """Load and create the plugin tools as build_registry does, without the rest of the registry (MCP
    servers): SettingsError naming the first that is broken or takes a name already taken. For a
    worker's start, before its pool forks."""
    _named_apart(settings, builtin_tools(settings), plugin_tools(settings))


def _named_apart(settings: Settings, builtins: list[Tool], plugins: list[Tool]) -> None:
    """A plugin named as a built-in tool (one not switched off) or an earlier plugin would replace
    it without a word: `exec` by a command runner without exec's limits, say. Refused instead."""
    disabled = set(settings.tools.disabled_groups)
    taken = {t.name for t in builtins if t.group not in disabled}
    for spec, tool in zip(settings.tools.plugins, plugins, strict=True):
        if tool.name in taken:
            raise SettingsError(f"NANOFLEET_TOOLS__PLUGINS: '{spec}' is named '{tool.name}', as a built-in tool or "
                                "an earlier plugin is: give it another name (a built-in's group can be switched "
                                "off with NANOFLEET_TOOLS__DISABLED_GROUPS)")
        taken.add(tool.name)


def build_registry(settings: Settings) -> ToolRegistry:
    """Built-in and plugin tools, then the tools of the configured MCP servers. Built once per process
    at start-up (gateway, worker, `nanofleet agent`), so the settings that look like mistakes are
    reported here too."""
    builtins, plugins = builtin_tools(settings), plugin_tools(settings)
    _named_apart(settings, builtins, plugins)
    tools = [*builtins, *plugins]
    registry = ToolRegistry(settings, tools)
    mcp.attach(settings, registry)
    startup_checks.warn(settings, [*registry.names(), *(t.name for t in tools)])  # a disabled group's too
    return registry
