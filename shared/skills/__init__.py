"""Skills: `skills/<name>/SKILL.md` folders (nanobot/OpenClaw format) in the workspace and built in.

A skill is a Markdown file with YAML front matter (`name`, `description`, `metadata`). The system
prompt carries a short index; the agent reads a skill's file with `read_file` when it needs it;
skills marked `always` are inlined. A skill whose required binaries or variables are missing is
listed as unavailable, with the reason.
"""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shared.settings import Settings

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
SKILL_FILE = "SKILL.md"
META_KEYS = ("nanobot", "openclaw", "clawdbot")  # where nanobot-family tools nest their metadata
MAX_SKILL_CHARS = 20_000


@dataclass
class Skill:
    """One skill as found on disk, with whether it can be used here."""

    name: str
    description: str
    file: Path
    source: str  # "workspace" or "builtin"
    always: bool = False
    missing: list[str] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return not self.missing

    @property
    def location(self) -> str:
        """The path the agent passes to read_file (built-in skills are served under the same path)."""
        return f"skills/{self.file.parent.name}/{SKILL_FILE}"

    def body(self) -> str:
        """The instructions without the front matter."""
        return split_front_matter(self.file.read_text(errors="replace"))[1][:MAX_SKILL_CHARS].strip()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "source": self.source, "path": self.location,
                "always": self.always, "available": self.available,
                "reason": f"missing {', '.join(self.missing)}" if self.missing else None}


def split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """(front matter, body); no or unreadable front matter gives an empty mapping."""
    if not text.startswith("---"):
        return {}, text
    head, sep, body = text[3:].partition("\n---")
    if not sep:
        return {}, text
    try:
        data = yaml.safe_load(head)
    except yaml.YAMLError:
        return {}, body.partition("\n")[2]
    return (data if isinstance(data, dict) else {}), body.partition("\n")[2]


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


def missing_requirements(meta: dict[str, Any], settings: Settings) -> list[str]:
    """What the skill needs that this deployment lacks: binaries on the exec PATH, exec variables."""
    requires = _as_mapping(meta.get("requires"))
    path = settings.tools.exec.path
    missing = [f"bin {b}" for b in _strings(requires.get("bins")) if shutil.which(b, path=path) is None]
    missing += [f"env {e}" for e in _strings(requires.get("env")) if e not in settings.tools.exec.env]
    return missing


def read_skill(file: Path, source: str, settings: Settings) -> Skill:
    front, _ = split_front_matter(file.read_text(errors="replace"))
    meta = skill_metadata(front)
    return Skill(
        name=str(front.get("name") or file.parent.name),
        description=" ".join(str(front.get("description") or "").split()),
        file=file,
        source=source,
        always=bool(meta.get("always") or front.get("always")),
        missing=missing_requirements(meta, settings),
    )


def _scan(root: Path, source: str, settings: Settings) -> list[Skill]:
    if not root.is_dir():
        return []
    return [read_skill(f, source, settings) for f in sorted(root.glob(f"*/{SKILL_FILE}")) if f.is_file()]


def load_skills(settings: Settings) -> list[Skill]:
    """Built-in and workspace skills by name; a workspace skill replaces a built-in one of that name."""
    found = {s.name: s for s in _scan(BUILTIN_DIR, "builtin", settings)}
    found |= {s.name: s for s in _scan(settings.workspace / "skills", "workspace", settings)}
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
    files = sorted(root.glob(f"*/{SKILL_FILE}")) if root.is_dir() else []
    return tuple((str(f), (st := f.stat()).st_mtime_ns, st.st_size) for f in files)


@functools.cache
def _builtin_identities() -> tuple[tuple[str, int, int], ...]:
    return _identities(BUILTIN_DIR)  # package files: fixed while the process runs


def _section_key(settings: Settings) -> tuple[object, ...]:
    """Everything the section depends on: each skill file's identity and what its requirements are
    checked against. A few stat calls in the workspace, where parsing every skill is milliseconds."""
    exec_ = settings.tools.exec
    return (str(settings.workspace), exec_.path, tuple(sorted(exec_.env)), _builtin_identities(),
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
            lines += ["", f"### Skill: {s.name}", "", s.body()]
    return "\n".join(lines)
