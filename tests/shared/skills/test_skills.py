"""Skills: SKILL.md front matter in the nanobot/OpenClaw shapes, requirements checked against what
exec provides, workspace skills over built-in ones, the prompt's index, and GET /api/v1/skills."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from shared.agent.prompt import system_prompt
from shared.settings import Permission, Settings, load_settings
from shared.skills import load_skills, split_front_matter
from tests.support.stack import API_KEY, api_client


def write_skill(workspace: Path, folder: str, front: str, body: str = "Do the thing.") -> None:
    path = workspace / "skills" / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\n{front}\n---\n\n{body}\n")


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    return path


def settings_for(workspace: Path, bin_dir: Path, *, tools: list[str] | None = None,
                 granted: list[Permission] | None = None, **exec_settings: Any) -> Settings:
    """Every tool allowed, with every permission, unless `tools` and `granted` say otherwise."""
    return load_settings(workspace=workspace, api_keys=[API_KEY],
                         tools={"allowed": ["*"] if tools is None else tools,
                                "exec": {"path": str(bin_dir), **exec_settings}},
                         permissions={"granted": list(Permission) if granted is None else granted})


def install(bin_dir: Path, name: str) -> None:
    tool = bin_dir / name
    tool.write_text("#!/bin/sh\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)


def by_name(settings: Settings) -> dict[str, Any]:
    return {s.name: s for s in load_skills(settings)}


def test_builtin_skills_and_their_requirements(tmp_path: Path, bin_dir: Path) -> None:
    skills = by_name(settings_for(tmp_path, bin_dir))
    assert {"summarize-url", "daily-notes", "github"} <= set(skills)
    assert skills["summarize-url"].available and skills["summarize-url"].source == "builtin"
    assert skills["github"].missing == ["bin gh", "env GH_TOKEN"]
    install(bin_dir, "gh")
    ready = by_name(settings_for(tmp_path, bin_dir, env={"GH_TOKEN": "ghp_test"}))["github"]
    assert ready.available and ready.location == "skills/github/SKILL.md"


def test_a_skill_the_tools_here_refuse_is_unavailable(tmp_path: Path, bin_dir: Path) -> None:
    """Skills were listed available with read_file (how the agent reads one) or the tools they use
    refused here: the model tried them, and the API said they could be used (helper's walkthrough)."""
    write_skill(tmp_path, "inline", "name: inline\ndescription: d\nmetadata:\n  always: true")
    write_skill(tmp_path, "mcp", "name: mcp\ndescription: d\nmetadata:\n  requires:\n    tools: [mcp_docs_search]")
    nothing = by_name(settings_for(tmp_path, bin_dir, tools=[], granted=[]))  # the default: no tool at all
    assert nothing["summarize-url"].missing == ["tool read_file", "tool web_fetch"]
    assert nothing["inline"].available  # inlined in the prompt: nothing to read
    no_grant = by_name(settings_for(tmp_path, bin_dir, tools=["read_file", "web_fetch", "mcp_*"], granted=[]))
    assert no_grant["summarize-url"].missing == ["tool read_file", "tool web_fetch"]  # FS_READ, NET_HTTP
    assert no_grant["mcp"].missing == ["tool read_file"]  # not built in: allowed by name is all that can be told
    reading = by_name(settings_for(tmp_path, bin_dir, tools=["read_file", "time"], granted=[Permission.FS_READ]))
    assert reading["daily-notes"].missing == ["tool write_file"] and reading["mcp"].missing == ["tool mcp_docs_search"]
    text = system_prompt(settings_for(tmp_path, bin_dir, tools=["read_file"], granted=[Permission.FS_READ]))
    assert "- summarize-url: " in text and "[unavailable: missing tool web_fetch]" in text


def test_metadata_shapes(tmp_path: Path, bin_dir: Path) -> None:
    write_skill(tmp_path, "yaml-map", "name: yaml-map\ndescription: plain YAML\nmetadata:\n  requires:\n"
                "    bins: [jq]\n  always: true")
    write_skill(tmp_path, "nested", 'name: nested\ndescription: nanobot style\nmetadata: {"nanobot": '
                '{"emoji": "x", "requires": {"env": ["API_TOKEN"]}}}')
    write_skill(tmp_path, "json-string", "name: json-string\ndescription: a JSON string\nmetadata: "
                '\'{"openclaw": {"requires": {"bins": ["jq", "rg"]}, "always": true}}\'')
    write_skill(tmp_path, "inner-string", "name: inner-string\ndescription: nested JSON string\nmetadata:\n"
                '  nanobot: \'{"always": true}\'')
    write_skill(tmp_path, "broken", "name: [unclosed\ndescription: x")
    install(bin_dir, "jq")
    skills = by_name(settings_for(tmp_path, bin_dir))
    assert skills["yaml-map"].available and skills["yaml-map"].always
    assert skills["nested"].missing == ["env API_TOKEN"]
    assert skills["json-string"].missing == ["bin rg"] and skills["json-string"].always
    assert skills["inner-string"].always and skills["inner-string"].available
    assert skills["[unclosed"].description == "x" and skills["[unclosed"].source == "workspace"  # read as lines


def test_workspace_skill_replaces_the_builtin_one(tmp_path: Path, bin_dir: Path) -> None:
    write_skill(tmp_path, "my-github", "name: github\ndescription: our own GitHub rules")
    skill = by_name(settings_for(tmp_path, bin_dir))["github"]
    assert skill.source == "workspace" and skill.available and skill.location == "skills/my-github/SKILL.md"


def test_prompt_carries_an_index_and_inlines_always_skills(tmp_path: Path, bin_dir: Path) -> None:
    write_skill(tmp_path, "house-rules", "name: house-rules\ndescription: rules\nmetadata:\n  always: true",
                "Always answer in haiku.")
    write_skill(tmp_path, "needs-rg", "name: needs-rg\ndescription: search code\nmetadata:\n  always: true\n"
                "  requires:\n    bins: [rg]", "Use rg to search.")
    text = system_prompt(settings_for(tmp_path, bin_dir))
    assert "## Skills" in text and "read_file" in text
    assert "- summarize-url: " in text and "(skills/summarize-url/SKILL.md)" in text
    assert "- github: " in text and "[unavailable: missing bin gh, env GH_TOKEN]" in text
    assert "### Skill: house-rules\n\nAlways answer in haiku." in text
    assert "Use rg to search." not in text  # an always skill that cannot run is only listed
    assert "description: rules" not in text


def test_front_matter_parsing_edges() -> None:
    assert split_front_matter("no front matter") == ({}, "no front matter")
    assert split_front_matter("---\nname: x\nno end") == ({}, "---\nname: x\nno end")
    assert split_front_matter("---\n- a list\n---\nbody") == ({}, "body")



def test_skills_linked_out_of_the_workspace_are_not_read(tmp_path: Path, bin_dir: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A SKILL.md (or the skills folder) planted as a symlink to a file outside the workspace is
    skipped, as read_file would refuse it: an `always` skill would put that file in every prompt."""
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    write_skill(outside, "leak", "name: leak\ndescription: d\nmetadata:\n  always: true", "SECRET-BODY")
    (workspace / "skills" / "evil").mkdir(parents=True)
    (workspace / "skills" / "evil" / "SKILL.md").symlink_to(outside / "skills" / "leak" / "SKILL.md")
    write_skill(workspace, "fine", "name: fine\ndescription: still here")
    settings = settings_for(workspace, bin_dir)
    text = system_prompt(settings)
    assert "leak" not in by_name(settings) and "SECRET-BODY" not in text
    assert "- fine: still here" in text
    assert "skills/evil/SKILL.md skipped" in caplog.text and "outside the workspace" in caplog.text
    linked = tmp_path / "ws2"
    linked.mkdir()
    (linked / "skills").symlink_to(outside / "skills")
    assert "leak" not in by_name(settings_for(linked, bin_dir))
    assert "SECRET-BODY" not in system_prompt(settings_for(linked, bin_dir))


def alias_bomb(depth: int) -> str:
    """Front matter of a few hundred bytes whose aliases expand to 10**depth strings."""
    lines = ['a0: &a0 "xxxxxxxxxx"']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, depth + 1)]
    return "\n".join([*lines, f"description: *a{depth}"])


def test_hostile_front_matter_is_skipped_and_the_rest_still_listed(tmp_path: Path, bin_dir: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    write_skill(tmp_path, "bomb", alias_bomb(5))  # small enough not to take the machine down on a regression
    write_skill(tmp_path, "huge", "name: huge\ndescription: " + "x" * 20_000)
    write_skill(tmp_path, "mapping", "name: mapping\ndescription: {nested: [1, 2]}")
    write_skill(tmp_path, "wordy", "name: wordy\ndescription: " + "word " * 300)
    write_skill(tmp_path, "fine", "name: fine\ndescription: still here")
    skills = by_name(settings_for(tmp_path, bin_dir))
    assert {"fine", "wordy", "github"} <= set(skills) and not {"bomb", "huge", "mapping"} & set(skills)
    assert len(skills["wordy"].description) == 500 and skills["wordy"].description.startswith("word word")
    assert "alias" in caplog.text and "skills/huge/SKILL.md skipped" in caplog.text
    assert "- fine: still here" in system_prompt(settings_for(tmp_path, bin_dir))
    assert split_front_matter(f"---\n{alias_bomb(5)}\n---\nbody") == ({}, "body")


def test_skills_endpoint(tmp_path: Path, bin_dir: Path) -> None:
    write_skill(tmp_path, "notes", "name: notes\ndescription: take notes")
    for client in api_client(settings_for(tmp_path, bin_dir)):
        listed = {s["name"]: s for s in client.get("/api/v1/skills").json()}
        assert listed["notes"] == {"name": "notes", "description": "take notes", "source": "workspace",
                                   "path": "skills/notes/SKILL.md", "always": False, "available": True,
                                   "reason": None}
        assert listed["github"]["reason"] == "missing bin gh, env GH_TOKEN"
        assert client.get("/api/v1/skills", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_front_matter_yaml_cannot_read_is_read_as_lines(tmp_path: Path, bin_dir: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """An unquoted `: ` in a value (nanobot's line reader takes it) made the whole front matter {}:
    no description, and its requirements unchecked, without a word in the log."""
    write_skill(tmp_path, "colon", 'name: colon\ndescription: Fetch a page: then "summarise" it\n'
                'metadata: {"nanobot": {"requires": {"bins": ["nonexistentbin"]}}}')
    skill = by_name(settings_for(tmp_path, bin_dir))["colon"]
    assert skill.description == 'Fetch a page: then "summarise" it'
    assert skill.missing == ["bin nonexistentbin"] and not skill.available
    assert "skills/colon/SKILL.md is not valid YAML" in caplog.text


def test_a_byte_order_mark_does_not_hide_the_front_matter(tmp_path: Path, bin_dir: Path) -> None:
    path = tmp_path / "skills" / "bom" / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_bytes("\ufeff---\nname: bom-skill\ndescription: saved by Notepad\n---\nbody\n".encode())
    skill = by_name(settings_for(tmp_path, bin_dir))["bom-skill"]
    assert skill.description == "saved by Notepad"


@pytest.mark.parametrize(("value", "inlined"), [('"false"', False), ("'no'", False), ('"true"', True),
                                                ("true", True), ("false", False), ("0", False)])
def test_always_as_text_means_what_it_says(tmp_path: Path, bin_dir: Path, value: str, inlined: bool) -> None:
    write_skill(tmp_path, "rules", f"name: rules\ndescription: d\nmetadata:\n  always: {value}", "RULES BODY")
    assert by_name(settings_for(tmp_path, bin_dir))["rules"].always is inlined
    assert ("RULES BODY" in system_prompt(settings_for(tmp_path, bin_dir))) is inlined


def test_skills_of_one_name_or_folder_do_not_mislead(tmp_path: Path, bin_dir: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Two workspace skills of one name: one was dropped without a word. A workspace folder named as a
    built-in skill's, holding another skill: the built-in one stayed listed at that path, where
    read_file gives the workspace file."""
    write_skill(tmp_path, "dup1", "name: same\ndescription: first")
    write_skill(tmp_path, "dup2", "name: same\ndescription: second")
    write_skill(tmp_path, "github", "name: my-gh\ndescription: ours")
    skills = by_name(settings_for(tmp_path, bin_dir))
    assert skills["same"].description == "first" and "skills/dup2/SKILL.md skipped" in caplog.text
    assert "github" not in skills and skills["my-gh"].location == "skills/github/SKILL.md"
