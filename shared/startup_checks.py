"""Start-up warnings for settings that load but are likely mistakes: allowed tool names that name no
tool, platforms with some of their credentials set but not all (such a platform is off), NANOFLEET_
variables and config file keys that name no setting (a typo is otherwise ignored), no API key at
all, and (in the processes that call the model) no key for a model whose provider wants one."""

from __future__ import annotations

import logging
import os
import types
import typing
from collections.abc import Iterable, Mapping
from difflib import get_close_matches
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from shared.channels import REGISTRY
from shared.channels.base import BaseChannel
from shared.llm import missing_key, unplaced
from shared.settings import CONFIG_FILE_ENV, Settings
from shared.settings_errors import config_table
from shared.tools.registry import is_allowed

log = logging.getLogger(__name__)
MCP_PREFIX = "mcp_"  # MCP tools are named mcp_<server>_<tool> (shared/tools/mcp/tool.py)
PREFIX, DELIMITER = Settings.model_config["env_prefix"], Settings.model_config["env_nested_delimiter"] or "__"
# NANOFLEET_ variables that are not settings but are read as they are
NOT_SETTINGS = frozenset({
    CONFIG_FILE_ENV,  # the TOML file under the environment (shared/settings.py)
    "NANOFLEET_PORT",  # docker/compose.yml's host port, in .env: every container's environment
    "NANOFLEET_TEST_DATABASE_URL", "NANOFLEET_TEST_REDIS_URL",  # where the tests find their servers
    "NANOFLEET_FUZZ_EXAMPLES", "NANOFLEET_HYPOTHESIS_PROFILE",  # test knobs (Makefile)
})
warned_at_start = False  # set by a worker that warned before its first task (see warn)
CLOSE = 0.7  # difflib's similarity from which a setting's name is offered as the one meant


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


def _unwrap(annotation: Any) -> Any:
    """X | None -> X."""
    if get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _fit(annotation: Any, names: list[str]) -> list[str] | None:
    """`names` (a variable's parts) as a path of settings below `annotation`, each unknown name
    replaced by the closest one; None when a name is close to none, or a plain value has more below
    it. A mapping (profiles, MCP servers, env) takes any key, and its values are walked in turn."""
    if not names:
        return []
    annotation, (name, *rest) = _unwrap(annotation), names
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if name not in annotation.model_fields:
            if not (closest := get_close_matches(name, annotation.model_fields, n=1, cutoff=CLOSE)):
                return None
            name = closest[0]
        below = annotation.model_fields[name].annotation
    elif get_origin(annotation) is dict:
        below = get_args(annotation)[1]
    else:
        return None  # a plain value has nothing below it
    tail = _fit(below, rest)
    return None if tail is None else [name, *tail]


def _paths(annotation: Any, at: tuple[str, ...] = ()) -> Iterable[tuple[str, ...]]:
    """Every setting's path of names below `annotation` (groups of settings included)."""
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, field in annotation.model_fields.items():
            yield (*at, name)
            yield from _paths(field.annotation, (*at, name))


def _placed(names: list[str]) -> list[str] | None:
    """The one setting whose path ends with `names` (NANOFLEET_EXEC__RUN_AS_USER is the tools'
    exec setting), else None."""
    found = [p for p in _paths(Settings) if list(p[-len(names):]) == names and len(p) > len(names)]
    return list(found[0]) if len(found) == 1 else None


def unknown_variables(environ: Mapping[str, str]) -> dict[str, str | None]:
    """NANOFLEET_ variables in `environ` that name no setting (so nothing reads them) -> the closest
    setting's variable, or None. Names are matched as pydantic-settings matches them: ignoring case."""
    found: dict[str, str | None] = {}
    for var in environ:
        upper = var.upper()
        if not upper.startswith(PREFIX) or upper in NOT_SETTINGS:
            continue
        names = upper.removeprefix(PREFIX).lower().split(DELIMITER)
        if (fitted := _fit(Settings, names)) != names:
            fitted = fitted or _placed(names)
            found[var] = PREFIX + DELIMITER.join(fitted).upper() if fitted else None
    return found


def unknown_keys(table: Mapping[str, Any], *, annotation: Any = Settings, at: str = "") -> dict[str, str | None]:
    """Keys of a config file's tables that name no setting (so nothing reads them), as dotted paths
    -> the closest setting's path, or None. As the settings library reads them: the top-level keys
    in any case (`[LLM]`), the keys below them exactly (`[tools] ALLOWED` is not read)."""
    found: dict[str, str | None] = {}
    annotation = _unwrap(annotation)
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    for key, value in table.items():
        name = key.lower() if annotation is Settings else key
        if is_model and name not in annotation.model_fields:
            fitted = _fit(annotation, [key.lower()])
            found[at + key] = at + fitted[0] if fitted else None
            continue
        below = annotation.model_fields[name].annotation if is_model else (
            get_args(annotation)[1] if get_origin(annotation) is dict else None)
        if isinstance(value, dict) and below is not None:
            found |= unknown_keys(value, annotation=below, at=f"{at}{key}.")
    return found


def warn(settings: Settings, tool_names: Iterable[str], *, at_start: bool = False) -> None:
    """Log a WARNING for each likely mistake (the process starts anyway). A worker warns `at_start`,
    before any task builds its tool registry; that build then says only what it alone can (the
    `mcp_` entries of NANOFLEET_TOOLS__ALLOWED: MCP tools are listed once their servers answer)."""
    global warned_at_start
    again, warned_at_start = warned_at_start, warned_at_start or at_start
    if not again:
        warn_misspelt()
    known = sorted(set(tool_names))
    unknown = [e for e in unknown_allowed(settings, known) if not again or e.startswith(MCP_PREFIX)]
    if unknown:
        log.warning("NANOFLEET_TOOLS__ALLOWED: %s match no known tool, so nothing they name can run; known tools: %s",
                    ", ".join(repr(e) for e in unknown), ", ".join(known))
    for name, missing in [] if again else half_configured(settings).items():
        log.warning("%s is off: some of its settings are set, but not %s (its webhook answers 404 until they are)",
                    name, ", ".join(missing))


def warn_misspelt() -> None:
    """A WARNING for each variable (or config file key) that looks like a setting but is none: the
    processes that build no tool registry (beat, migrate, status, cron) call this alone."""
    # Settings read the environment; what they ignored is only found there (names are logged, never values).
    for var, meant in sorted(unknown_variables(os.environ).items()):
        hint = f"did you mean {meant}?" if meant else "see .env.example for every setting"
        log.warning("%s is not a nanofleet setting, so it is ignored: %s", var, hint)
    for key, meant in sorted(unknown_keys(config_table(os.environ.get(CONFIG_FILE_ENV))).items()):
        hint = f"did you mean {meant}?" if meant else "see .env.example for every setting (as TOML tables)"
        log.warning("%s: %s is not a nanofleet setting, so it is ignored: %s",
                    os.environ.get(CONFIG_FILE_ENV), key, hint)


def _models(settings: Settings) -> list[tuple[str, str]]:
    """(setting, litellm model string) of every model the settings name."""
    llm, prefix = settings.llm, "NANOFLEET_LLM__"
    named = [(f"{prefix}MODEL", llm.model)]
    named += [(f"{prefix}PROFILES__{name.upper()}__MODEL", p.model) for name, p in llm.profiles.items()]
    named += [(f"{prefix}FALLBACKS", m) for m in llm.fallbacks if m not in llm.profiles]
    named += [(f"{prefix}TRANSCRIPTION_MODEL", m) for m in [llm.transcription_model] if m and m not in llm.profiles]
    beat = settings.heartbeat.model
    return named + ([("NANOFLEET_HEARTBEAT__MODEL", beat)] if beat and beat not in llm.profiles else [])


def warn_model_key(settings: Settings) -> None:
    """Where the model is called (agent and subagent workers, `nanofleet agent`): a model litellm
    cannot place, a hosted model without a key. Asking litellm loads it, which the other processes
    do without."""
    for var, model in _models(settings):
        if unplaced(model):
            log.warning("%s=%s names no provider litellm knows, so every call to it fails: write it as provider/"
                        "model (openai/gpt-4.1-mini, anthropic/claude-sonnet-4-5, ollama/llama3...)", var, model)
    if wanted := missing_key(settings.llm):
        log.warning("no key is set for the model %s: its provider refuses every call without one, and each turn "
                    "ends with a reply saying so; set NANOFLEET_LLM__API_KEY (or %s), or "
                    "NANOFLEET_LLM__API_BASE for a server of your own that needs none",
                    settings.llm.model, " or ".join(wanted))


def warn_gateway(settings: Settings) -> None:
    """The gateway's own likely mistakes (workers and `nanofleet agent` serve no API)."""
    if not settings.api_keys:
        log.warning("no API key is configured, so the REST API (/api/v1) refuses every request: set "
                    "NANOFLEET_API_KEYS to a JSON list of keys, e.g. '[\"a-long-random-key\"]'")
