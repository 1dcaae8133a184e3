"""Default deny for the built-in tools: a tool runs only when allowed by name or glob and every
permission it declares is granted; a rejected call leaves no trace."""

from __future__ import annotations

from collections.abc import Callable
from fnmatch import fnmatchcase
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from shared.settings import Permission
from shared.tools import builtin_tools
from shared.tools.base import ErrorCode
from shared.tools.registry import ToolRegistry, decide
from tests.shared.tools.conftest import call, tool_settings

TOOLS = builtin_tools(tool_settings(Path("/nonexistent")))
NAMES = [t.name for t in TOOLS]
GROUPS = {"files": {"read_file", "write_file", "edit_file", "list_dir"}, "shell": {"exec"},
          "web": {"web_search", "web_fetch", "http_get"}, "messaging": {"message"}}
patterns = st.lists(st.one_of(st.sampled_from(NAMES), st.sampled_from(["*", "web_*", "*_file", "e*", "nope"])),
                    max_size=4)
grants = st.sets(st.sampled_from(list(Permission)))


def test_every_builtin_tool_has_its_group_and_permissions() -> None:
    by_name = {t.name: t for t in TOOLS}
    for group, names in GROUPS.items():
        assert {n for n, t in by_name.items() if t.group == group} == names
    assert by_name["exec"].permissions == {Permission.SHELL}
    assert by_name["write_file"].permissions == {Permission.FS_WRITE}
    assert by_name["read_file"].permissions == {Permission.FS_READ}
    assert by_name["web_fetch"].permissions == {Permission.NET_HTTP}


@given(allowed=patterns, granted=grants)
def test_decision_is_allow_list_and_grants(allowed: list[str], granted: set[Permission]) -> None:
    settings = tool_settings(Path("/nonexistent"), allowed=allowed, granted=[p.value for p in granted])
    for tool in TOOLS:
        verdict = decide(tool, settings)
        named = any(fnmatchcase(tool.name, p) for p in allowed)
        if verdict is None:
            assert named and tool.permissions <= granted
        elif not named:
            assert verdict.error == ErrorCode.NOT_ALLOWED
        else:
            assert verdict.error == ErrorCode.PERMISSION_DENIED and not tool.permissions <= granted


def test_disabled_groups_drop_their_tools(registry: Callable[..., ToolRegistry]) -> None:
    reg = registry(disabled_groups=["shell", "web"])
    assert "exec" not in reg.names() and "web_fetch" not in reg.names() and "read_file" in reg.names()
    assert call(reg, "exec", {"command": "true"}).error == ErrorCode.NOT_FOUND


def test_unknown_tool_names_only_the_tools_offered(registry: Callable[..., ToolRegistry]) -> None:
    result = call(registry(allowed=["time", "read_file", "exec"], granted=["FS_READ"]), "nosuch", {})
    assert result.error == ErrorCode.NOT_FOUND
    assert result.message.endswith("available: read_file, time")  # exec is allowed, its SHELL not granted
    assert call(registry(allowed=[]), "nosuch", {}).message.endswith("available: none")


def test_rejected_calls_leave_no_side_effect(registry: Callable[..., ToolRegistry], workspace: Path) -> None:
    (workspace / "keep.txt").write_text("original")
    not_allowed = registry(allowed=["read_file"])
    not_granted = registry(granted=["FS_READ"])
    for reg, code in ((not_allowed, ErrorCode.NOT_ALLOWED), (not_granted, ErrorCode.PERMISSION_DENIED)):
        assert call(reg, "write_file", {"path": "new.txt", "content": "x"}).error == code
        assert call(reg, "edit_file", {"path": "keep.txt", "old_text": "original", "new_text": "changed"}).error == code
        assert call(reg, "exec", {"command": "touch made-by-exec"}).status == "REJECTED"
    assert sorted(p.name for p in workspace.iterdir()) == ["keep.txt"]
    assert (workspace / "keep.txt").read_text() == "original"


def test_denied_tools_are_not_offered_to_the_model(registry: Callable[..., ToolRegistry]) -> None:
    reg = registry(allowed=["read_file", "exec"], granted=["FS_READ"])
    assert [s["function"]["name"] for s in reg.specs()] == ["read_file"]
    assert {d["name"]: d["group"] for d in reg.describe()}["exec"] == "shell"
