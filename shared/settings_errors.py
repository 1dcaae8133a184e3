"""Settings errors that name the variable: a value pydantic refuses, a JSON value that does not
parse, a config file that is not TOML."""

from __future__ import annotations

import json
import tomllib
import types
from collections.abc import Mapping, Sequence
from itertools import takewhile
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

PREFIX = "NANOFLEET_"
DELIMITER = "__"
SEQUENCES = (list, set, frozenset, tuple)


class SettingsError(Exception):
    """Configuration that prevents start-up; the message names the variable."""


def variable(loc: Sequence[int | str]) -> str:
    """The environment variable an error location points at: ("permissions", "granted", 1) is
    `NANOFLEET_PERMISSIONS__GRANTED (item 2)`; a list index is no part of a variable's name."""
    if not loc:
        return "settings"
    names: list[str] = []
    for i, part in enumerate(loc):
        if isinstance(part, int):
            inside = "".join(f".{p}" if isinstance(p, str) else f"[{p + 1}]" for p in loc[i + 1:])
            return f"{PREFIX}{DELIMITER.join(names)} (item {part + 1}{inside})"
        names.append(part.upper())
    return PREFIX + DELIMITER.join(names)


def file_key(loc: Sequence[int | str]) -> str:
    """A config file's key an error location points at: ("permissions", "granted", 1) is
    `permissions.granted[2]`."""
    return "".join(f"[{p + 1}]" if isinstance(p, int) else f"{'.' if i else ''}{p}" for i, p in enumerate(loc))


def config_table(path: str | None) -> dict[str, Any]:
    """The config file's tables; empty without one, or for one that cannot be read (Settings
    refuses such a file, naming it)."""
    if not path:
        return {}
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}


def _source(loc: Sequence[int | str], environ: Mapping[str, str], config_file: str | None,
            table: dict[str, Any]) -> str:
    """Where the refused value came from: the config file's key when the file holds it and no
    variable sets it (or a group of settings above it, as JSON), else the variable."""
    names = [str(p) for p in takewhile(lambda p: isinstance(p, str), loc)]
    set_here = {k.upper() for k in environ}
    if _holds(table, names) and not any(
            f"{PREFIX}{DELIMITER.join(names[:n])}".upper() in set_here for n in range(1, len(names) + 1)):
        return f"{file_key(loc)} in {config_file}"
    return variable(loc)


def _holds(table: dict[str, Any], names: list[str]) -> bool:
    """Whether the file's tables hold the path (its top-level keys in any case, as they are read)."""
    node: Any = {k.lower(): v for k, v in table.items()}
    if not node:
        return False
    for name in names:
        if not isinstance(node, dict) or name not in node:
            return False
        node = node[name]
    return True


def describe_validation(err: ValidationError, *, environ: Mapping[str, str] | None = None,
                        config_file: str | None = None) -> str:
    table = config_table(config_file)
    lines = [f"{_source(e['loc'], environ or {}, config_file, table)}: {e['msg'].removeprefix('Value error, ')}"
             for e in err.errors()]
    return "invalid configuration:\n  " + "\n  ".join(lines)


def describe_unparsable(model: type[BaseModel], environ: Mapping[str, str], cause: Exception) -> str:
    """Every variable whose value must be JSON (it sets a list, mapping or group of settings) and
    does not parse, found by walking `model`'s fields along each name's `__` path (the settings
    library only names the top-level field)."""
    lines = []
    for name, value in sorted(environ.items()):
        field = _target(model, name)
        if field is None:
            continue
        try:
            json.loads(value)
        except ValueError as err:
            lines.append(f"{name}: not valid JSON ({_expected(field, name, value)}): {err}")
    if not lines:  # not a JSON value after all: the library's own words, and what caused them
        lines.append(f"{cause}: {cause.__cause__ or cause}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _target(model: type[BaseModel], name: str) -> FieldInfo | None:
    """The field `name` sets when that field takes JSON (a list, mapping or model), else None.
    Past a mapping's key the settings library lets a value that is not JSON through as a string,
    so only a model's own field counts, as it does there."""
    if not name.upper().startswith(PREFIX):
        return None
    field: FieldInfo | None = None
    annotation: Any = model
    for part in name[len(PREFIX):].lower().split(DELIMITER):
        if (inner := _model(annotation)) is not None:
            field = inner.model_fields.get(part)
            if field is None:
                return None
            annotation = field.annotation
        elif get_origin(_optional(annotation)) is dict:
            field, annotation = None, get_args(_optional(annotation))[-1]
        else:
            return None
    return field if field is not None and _takes_json(field.annotation) else None


def _optional(annotation: Any) -> Any:
    """`X` for `X | None`; anything else as it is."""
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _model(annotation: Any) -> type[BaseModel] | None:
    inner = _optional(annotation)
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def _takes_json(annotation: Any) -> bool:
    inner = _optional(annotation)
    return _model(inner) is not None or get_origin(inner) in (dict, *SEQUENCES) or inner in (dict, *SEQUENCES)


def _expected(field: FieldInfo, name: str, value: str) -> str:
    inner = _optional(field.annotation)
    is_list = get_origin(inner) in SEQUENCES or inner in SEQUENCES
    example = json.dumps(field.examples[0] if field.examples else ["first", "second"] if is_list else {"name": "value"},
                         separators=(",", ":"))
    stripped = value.strip()
    text = f"a JSON {'list' if is_list else 'object'} is expected, e.g. {example}"
    if not stripped:
        text += "; the value is empty: unset the variable for the default"
    elif stripped[0] in "[{" and '"' not in stripped and any(c.isalpha() for c in stripped):
        # `set -a; . ./.env` with an unquoted JSON value: its strings are bare words
        text += f"; its double quotes are gone, as when a shell reads it unquoted: single-quote it, {name}='{example}'"
    return text
