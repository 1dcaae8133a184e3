"""Skills: `skills/<name>/SKILL.md` folders (nanobot/OpenClaw format) in the workspace and built in.

A skill is a Markdown file with YAML front matter (`name`, `description`, `metadata`). The system
prompt carries a short index; the agent reads a skill's file with `read_file` when it needs it;
skills marked `always` are inlined. A skill whose required binaries, variables or tools are
missing here is listed as unavailable, with the reason.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shared.settings import Settings

log = logging.getLogger(__name__)
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
SKILL_FILE = "SKILL.md"
META_KEYS = ("nanobot", "openclaw", "clawdbot")  # where nanobot-family tools nest their metadata
MAX_SKILL_CHARS = 20_000
MAX_FILE_BYTES = 256_000  # read no more of a SKILL.md: the body is cut at MAX_SKILL_CHARS anyway
MAX_FRONT_MATTER_CHARS = 16_000
MAX_NAME_CHARS = 100
MAX_DESCRIPTION_CHARS = 500  # every LLM step carries it in the system prompt


class BadSkill(ValueError):
    """A SKILL.md that is not used: oversized or hostile front matter, a name or description that is
    not text."""


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without aliases: a few hundred bytes of nested aliases expand to gigabytes."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            raise BadSkill("front matter uses a YAML alias (*name), which skills do not allow")
        return super().compose_node(parent, index)


@dataclass
class Skill:
    """One skill as found on disk, with whether it can be used here."""

    name: str
    description: str
    file: Path
    source: str  # "workspace" or "builtin"
    always: bool = False
    missing: list[str] = field(default_factory=list)
    body: str = field(default="", repr=False)  # the instructions without the front matter

    @property
    def available(self) -> bool:
        return not self.missing

    @property
    def location(self) -> str:
        """The path the agent passes to read_file (built-in skills are served under the same path)."""
        return f"skills/{self.file.parent.name}/{SKILL_FILE}"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "source": self.source, "path": self.location,
                "always": self.always, "available": self.available,
                "reason": f"missing {', '.join(self.missing)}" if self.missing else None}


def _read(file: Path, workspace: Path | None) -> str:
    """The start of a SKILL.md: a workspace one read as the file tools read (one behind a symlink
    that leads out of the workspace is a BadSkill), a built-in one (`workspace` None) as it is."""
    if workspace is None:
        with file.open("rb") as fh:
            return fh.read(MAX_FILE_BYTES).decode(errors="replace")
    from shared.tools.workspace import OutsideWorkspace, read_start  # shared.tools imports this module

    try:
        data, _ = read_start(workspace, str(file.relative_to(workspace)), MAX_FILE_BYTES)
    except OutsideWorkspace as err:
        raise BadSkill(str(err)) from err
    return data.decode(errors="replace")


def _split(text: str) -> tuple[str | None, str]:
    """(raw front matter, body); no front matter gives None and the whole text. A byte order mark
    (Notepad writes one) is not text."""
    text = text.removeprefix("\ufeff")
    if not text.startswith("---"):
        return None, text
    head, sep, body = text[3:].partition("\n---")
    if not sep:
        return None, text
    return head, body.partition("\n")[2]


def parse_front_matter(head: str, where: str = "front matter") -> dict[str, Any]:
    """The front matter as a mapping ({} when it is not a mapping); BadSkill when it is too long or
    uses aliases. Front matter YAML cannot read (a `: ` in an unquoted value, which nanobot's line
    reader takes) is read as nanobot reads it, one `key: value` a line, with a warning."""
    if len(head) > MAX_FRONT_MATTER_CHARS:
        raise BadSkill(f"front matter is longer than {MAX_FRONT_MATTER_CHARS} characters")
    try:
        data = yaml.load(head, Loader=_NoAliasLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as err:
        problem = str(err).splitlines()[0] if str(err) else type(err).__name__
        log.warning("%s is not valid YAML (%s); read as `key: value` lines (quote a value with ': ' in it)",
                    where, problem)
        return {m["key"]: _unquoted(m["value"].strip()) for line in head.splitlines() if (m := _KEY_VALUE.match(line))}
    return data if isinstance(data, dict) else {}


_KEY_VALUE = re.compile(r"(?P<key>[A-Za-z_][\w-]*):(?P<value>.*)$")


def _unquoted(value: str) -> str:
    return value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" else value


def _flag(value: Any) -> bool:
    """A front matter yes or no: `true`, or the text of it (`always: "true"`); `"false"` is no."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return value is True or (type(value) is int and value == 1)


def split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """(front matter, body); no, unreadable or refused front matter gives an empty mapping."""
    head, body = _split(text)
    if head is None:
        return {}, body
    try:
        return parse_front_matter(head), body
    except BadSkill:
        return {}, body


def _as_mapping(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return {}
    return value if isinstance(value, dict) else {}


def skill_metadata(front: dict[str, Any]) -> dict[str, Any]:
    """`metadata` as a mapping or a JSON string, optionally nested under a nanobot/openclaw key."""
    meta = _as_mapping(front.get("metadata"))
    for key in META_KEYS:
        if key in meta:
            return _as_mapping(meta[key])
    return meta


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, list) else []


def missing_requirements(meta: dict[str, Any], settings: Settings, *, always: bool = False) -> list[str]:
    """What the skill needs that this deployment lacks: binaries on the exec PATH, exec variables,
    and tools it may use (`requires.tools`, and read_file to read a skill not inlined)."""
    requires = _as_mapping(meta.get("requires"))
    path = settings.tools.exec.path
    missing = [f"bin {b}" for b in _strings(requires.get("bins")) if shutil.which(b, path=path) is None]
    missing += [f"env {e}" for e in _strings(requires.get("env")) if e not in settings.tools.exec.env]
    tools = ([] if always else ["read_file"]) + [t for t in _strings(requires.get("tools")) if t != "read_file"]
    return missing + [f"tool {t}" for t in _refused(tools, settings)]


def _refused(names: list[str], settings: Settings) -> list[str]:
    """Those of the tools `names` a call would be refused: not allowed, switched off, or wanting a
    permission not granted (a tool that is not built in is judged by NANOFLEET_TOOLS__ALLOWED alone)."""
    if not names:
        return []
    from shared.tools import builtin_tools  # shared.tools imports this module
    from shared.tools.registry import decide, is_allowed

    builtin = {t.name: t for t in builtin_tools(settings)}
    off = set(settings.tools.disabled_groups)

    def refused(name: str) -> bool:
        tool = builtin.get(name)
        if tool is None:
            return not is_allowed(name, settings.tools.allowed)
        return tool.group in off or decide(tool, settings) is not None

    return [name for name in names if refused(name)]


def _text(front: dict[str, Any], key: str, limit: int) -> str:
    """A front matter string, whitespace folded and cut at `limit`; BadSkill for anything but text."""
    value = front.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadSkill(f"'{key}' must be text, not {type(value).__name__}")
    return " ".join(value[:limit * 2].split())[:limit]


def read_skill(file: Path, source: str, settings: Settings) -> Skill:
    """The skill in `file` (a workspace one unless `source` is "builtin"); raises BadSkill or
    OSError for one that cannot be used."""
    head, body = _split(_read(file, None if source == "builtin" else settings.workspace))
    front = parse_front_matter(head, f"the front matter of {file}") if head is not None else {}
    meta = skill_metadata(front)
    always = _flag(meta.get("always")) or _flag(front.get("always"))
    return Skill(
        name=_text(front, "name", MAX_NAME_CHARS) or file.parent.name,
        description=_text(front, "description", MAX_DESCRIPTION_CHARS),
        file=file,
        source=source,
        always=always,
        missing=missing_requirements(meta, settings, always=always),
        body=body[:MAX_SKILL_CHARS].strip(),
    )


def _scan(root: Path, source: str, settings: Settings) -> list[Skill]:
    """The usable skills under `root`; a bad one is left out with a warning, never failing the list."""
    if not root.is_dir():
        return []
    skills = []
    for file in sorted(root.glob(f"*/{SKILL_FILE}")):
        try:
            if file.is_file():
                skills.append(read_skill(file, source, settings))
        except (BadSkill, OSError) as err:
            log.warning("skill %s skipped: %s", file, err)
    return skills


def load_skills(settings: Settings) -> list[Skill]:
    """Built-in and workspace skills by name. A workspace skill replaces a built-in one of its name,
    or in its folder (whose path would lead read_file to the workspace one); of two workspace skills
    of one name, the first folder's is kept, with a warning."""
    ours = _scan(settings.workspace / "skills", "workspace", settings)
    folders = {s.file.parent.name for s in ours}
    found = {s.name: s for s in _scan(BUILTIN_DIR, "builtin", settings) if s.file.parent.name not in folders}
    for skill in ours:
        if (kept := found.get(skill.name)) is not None and kept.source == "workspace":
            log.warning("skill %s skipped: %s is named '%s' too", skill.location, kept.location, skill.name)
            continue
        found[skill.name] = skill
    return [found[name] for name in sorted(found)]


def builtin_file(relative: str) -> Path | None:
    """The built-in file behind `skills/<name>/...`, when the workspace does not have one."""
    parts = Path(relative).parts
    if len(parts) < 3 or parts[0] != "skills" or ".." in parts:
        return None
    target = (BUILTIN_DIR / Path(*parts[1:])).resolve()
    return target if target.is_file() and target.is_relative_to(BUILTIN_DIR) else None


_sections: dict[tuple[object, ...], str] = {}


def _identities(root: Path) -> tuple[tuple[str, int, int], ...]:
    """(path, mtime, size) of every skill file under `root`."""
    found = []
    for file in sorted(root.glob(f"*/{SKILL_FILE}")) if root.is_dir() else []:
        try:
            st = file.stat()
        except OSError:  # a dangling link, or removed since the glob: _scan skips it too
            continue
        found.append((str(file), st.st_mtime_ns, st.st_size))
    return tuple(found)


@functools.cache
def _builtin_identities() -> tuple[tuple[str, int, int], ...]:
    return _identities(BUILTIN_DIR)  # package files: fixed while the process runs


def _section_key(settings: Settings) -> tuple[object, ...]:
    """Everything the section depends on: each skill file's identity and what its requirements are
    checked against. A few stat calls in the workspace, where parsing every skill is milliseconds."""
    exec_, tools = settings.tools.exec, settings.tools
    return (str(settings.workspace), exec_.path, tuple(sorted(exec_.env)), tuple(tools.allowed),
            tuple(tools.disabled_groups), tuple(sorted(settings.permissions.granted)), _builtin_identities(),
            _identities(settings.workspace / "skills"))


def skills_section(settings: Settings) -> str:
    """The system prompt's skills index, with `always` skills inlined; built again only when a
    skill file or the exec settings change (every LLM step asks for it)."""
    key = _section_key(settings)
    if key not in _sections:
        if len(_sections) > 64:
            _sections.clear()
        _sections[key] = _render_section(settings)
    return _sections[key]


def _render_section(settings: Settings) -> str:
    skills = load_skills(settings)
    if not skills:
        return ""
    lines = ["## Skills", "",
             "Skills are instructions for particular jobs. Before using one, read its file with read_file."]
    for s in skills:
        state = "" if s.available else f" [unavailable: missing {', '.join(s.missing)}]"
        lines.append(f"- {s.name}: {s.description} ({s.location}){state}")
    for s in skills:
        if s.always and s.available:
            lines += ["", f"### Skill: {s.name}", "", s.body]
    return "\n".join(lines)
