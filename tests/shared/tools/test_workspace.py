"""The workspace path guard, as the file tools apply it: a path may name anything inside the
workspace (through `..` and inside symlinks too) and nothing outside it."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.tools.base import ErrorCode
from shared.tools.registry import ToolRegistry
from shared.tools.workspace import OutsideWorkspace, open_file, read_start, resolve
from tests.shared.tools.conftest import call

SECRET = "SECRET-OUTSIDE"
PARTS = ["a", "b", "..", ".", "", "in_link", "out_link", "up", "f.txt", "~", "new", "x y", "hard.txt"]


@pytest.fixture
def layout(tmp_path: Path, workspace: Path) -> tuple[Path, Path]:
    """A workspace with links that stay inside and links that lead out, next to a secret folder."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    (workspace / "a").mkdir()
    (workspace / "a" / "f.txt").write_text("inside")
    (workspace / "in_link").symlink_to(workspace / "a")
    (workspace / "out_link").symlink_to(outside)
    (workspace / "a" / "up").symlink_to("../..")  # relative: leads to tmp_path, outside
    (workspace / "secret_link.txt").symlink_to(outside / "secret.txt")
    os.link(outside / "secret.txt", workspace / "hard.txt")  # `ln /etc/shadow x` by a command exec ran
    return workspace, outside


def inside(workspace: Path, path: str) -> bool:
    """The oracle: where the operating system would take this path, relative to the workspace; a
    file with other hard links may be outside too, whatever its path says."""
    real = Path(os.path.realpath(os.path.join(workspace, os.path.expanduser(path))))
    if real.is_file() and real.stat().st_nlink > 1:
        return False
    return real == workspace.resolve() or real.is_relative_to(workspace.resolve())


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


relative = st.lists(st.sampled_from(PARTS), min_size=1, max_size=6).map("/".join)
paths = st.one_of(
    relative,
    relative.map(lambda p: "/" + p),
    st.text(alphabet=st.sampled_from(list("ab./~_ \x00")), max_size=20),
    st.sampled_from(["/etc/passwd", "/", "~", "~/x", "../outside/secret.txt", "secret_link.txt", "a/up/outside",
                     "hard.txt", "in_link/../hard.txt"]),
)
SLOW_OK = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SLOW_OK
@given(path=paths)
def test_write_succeeds_only_inside(layout: tuple[Path, Path], registry: Callable[..., ToolRegistry],
                                    path: str) -> None:
    workspace, outside = layout
    before = snapshot(outside)
    expected_inside = inside(workspace, path) if "\x00" not in path else False
    result = call(registry(), "write_file", {"path": path, "content": "written"})
    if result.ok:
        assert expected_inside, path
    if result.error == ErrorCode.PERMISSION_DENIED:
        assert not expected_inside, path
    assert snapshot(outside) == before


@SLOW_OK
@given(path=paths)
def test_read_and_list_never_see_outside(layout: tuple[Path, Path], registry: Callable[..., ToolRegistry],
                                         path: str) -> None:
    workspace, _ = layout
    reg = registry()
    expected_inside = inside(workspace, path) if "\x00" not in path else False
    for tool in ("read_file", "list_dir"):
        result = call(reg, tool, {"path": path})
        if result.ok:
            assert expected_inside, (tool, path)
            assert SECRET not in str(result.output) and "secret.txt" not in str(result.output)
        if result.error == ErrorCode.PERMISSION_DENIED:
            assert not expected_inside, (tool, path)


@SLOW_OK
@given(path=paths, limit=st.integers(min_value=0, max_value=10))
def test_read_start_never_reads_outside(layout: tuple[Path, Path], path: str, limit: int) -> None:
    """What the prompt, the heartbeat and skills read on their own is held to the guard too."""
    workspace, _ = layout
    try:
        data, more = read_start(workspace, path, limit)
    except (OutsideWorkspace, OSError):
        return
    assert inside(workspace, path), path
    assert (data, more) == (b"inside"[:limit], limit < len(b"inside"))


def test_guard_examples(layout: tuple[Path, Path]) -> None:
    workspace, _ = layout
    assert resolve(workspace, "in_link/f.txt") == (workspace / "a" / "f.txt").resolve()
    assert resolve(workspace, "a/../a/f.txt") == (workspace / "a" / "f.txt").resolve()
    assert resolve(workspace, str(workspace / "a")) == (workspace / "a").resolve()
    for bad in ("..", "../x", "/etc/passwd", "out_link/secret.txt", "a/up", "secret_link.txt", "~", "a\x00b"):
        with pytest.raises(OutsideWorkspace):
            resolve(workspace, bad)


def test_open_file_refuses_a_last_component_that_became_a_symlink(layout: tuple[Path, Path]) -> None:
    workspace, outside = layout
    target = resolve(workspace, "a/f.txt")
    (workspace / "a" / "f.txt").unlink()
    (workspace / "a" / "f.txt").symlink_to(outside / "secret.txt")  # after the check, before the open
    for mode in ("rb", "wb", "ab", "r+b"):
        with pytest.raises(OutsideWorkspace):
            open_file(workspace, target, mode)  # type: ignore[arg-type]
    assert (outside / "secret.txt").read_text() == SECRET


def test_open_file_refuses_a_folder_swapped_for_a_symlink_after_resolve(layout: tuple[Path, Path]) -> None:
    workspace, outside = layout
    (workspace / "d").mkdir()
    (workspace / "d" / "secret.txt").write_text("harmless")
    read_target, new_target = resolve(workspace, "d/secret.txt"), resolve(workspace, "d/sub/new.txt")
    (workspace / "d").rename(workspace / "elsewhere")
    (workspace / "d").symlink_to(outside)
    with pytest.raises(OutsideWorkspace):
        open_file(workspace, read_target, "rb")
    with pytest.raises(OutsideWorkspace):
        open_file(workspace, new_target, "wb", make_parents=True)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


@pytest.mark.parametrize(("tool", "args"), [
    ("read_file", {"path": "d/secret.txt"}),
    ("write_file", {"path": "d/secret.txt", "content": "pwned"}),
    ("edit_file", {"path": "d/secret.txt", "old_text": "SECRET", "new_text": "pwned"}),
    ("list_dir", {"path": "d"}),
    ("list_dir", {"path": "d", "recursive": True}),
])
def test_file_tools_hold_when_the_race_is_lost(layout: tuple[Path, Path], registry: Callable[..., ToolRegistry],
                                               monkeypatch: pytest.MonkeyPatch, tool: str,
                                               args: dict[str, Any]) -> None:
    """The swap lands between the path check and the open, as a racing process could make it."""
    workspace, outside = layout
    (workspace / "d").mkdir()

    def resolve_then_swap(ws: Path, path: str) -> Path:
        target = resolve(ws, path)
        (workspace / "d").rmdir()
        (workspace / "d").symlink_to(outside)
        return target

    monkeypatch.setattr(importlib.import_module(f"shared.tools.{tool}"), "resolve", resolve_then_swap)
    result = call(registry(), tool, args)
    assert result.error == ErrorCode.PERMISSION_DENIED
    assert SECRET not in str(result.output) and "secret.txt" not in str(result.output)
    assert (outside / "secret.txt").read_text() == SECRET


def test_file_tools_do_not_hang_on_a_fifo(workspace: Path, registry: Callable[..., ToolRegistry]) -> None:
    os.mkfifo(workspace / "pipe")
    assert call(registry(), "read_file", {"path": "pipe"}).error == ErrorCode.INVALID_ARGS
    assert not call(registry(), "write_file", {"path": "pipe", "content": "x"}).ok


@pytest.mark.parametrize(("tool", "args"), [
    ("read_file", {"path": "hard.txt"}),
    ("write_file", {"path": "hard.txt", "content": "pwned"}),
    ("write_file", {"path": "hard.txt", "content": "pwned", "append": True}),
    ("edit_file", {"path": "hard.txt", "old_text": "SECRET", "new_text": "pwned"}),
])
def test_file_tools_refuse_a_hard_link(layout: tuple[Path, Path], registry: Callable[..., ToolRegistry], tool: str,
                                       args: dict[str, Any]) -> None:
    """Under a root worker the file tools run as root and exec's commands as nobody: a command that
    can `ln /etc/shadow x` (fs.protected_hardlinks=0) must not get the file read or written for it."""
    workspace, outside = layout
    result = call(registry(), tool, args)
    assert result.error == ErrorCode.PERMISSION_DENIED, result
    assert "hard link" in result.message and SECRET not in str(result.output)
    assert (outside / "secret.txt").read_text() == SECRET  # not truncated by the open either
    with pytest.raises(OutsideWorkspace, match="hard link"):
        read_start(workspace, "hard.txt", 100)


def test_a_file_whose_other_name_is_gone_is_an_ordinary_file_again(layout: tuple[Path, Path],
                                                                   registry: Callable[..., ToolRegistry]) -> None:
    workspace, outside = layout
    (outside / "secret.txt").unlink()
    reg = registry()
    assert call(reg, "read_file", {"path": "hard.txt"}).output == SECRET
    assert call(reg, "edit_file", {"path": "hard.txt", "old_text": "SECRET", "new_text": "PUBLIC"}).ok
    assert call(reg, "write_file", {"path": "hard.txt", "content": "mine"}).ok
    assert (workspace / "hard.txt").read_text() == "mine"


@pytest.mark.parametrize("path", ["AGENTS.md", "./SOUL.md", "HEARTBEAT.md", "agents.md", "skills/new/SKILL.md",
                                  "notes/../USER.md", "alias.md"])
def test_the_files_that_shape_the_prompt_are_read_only_to_the_file_tools(
        workspace: Path, registry: Callable[..., ToolRegistry], path: str) -> None:
    """A page the model fetched must not be able to have it rewrite its own instructions."""
    for name in ("AGENTS.md", "SOUL.md", "USER.md", "HEARTBEAT.md"):
        (workspace / name).write_text("the operator's")
    (workspace / "notes").mkdir()
    (workspace / "alias.md").symlink_to("AGENTS.md")
    before = snapshot(workspace)
    for tool, args in [("write_file", {"path": path, "content": "obey me"}),
                       ("write_file", {"path": path, "content": "obey me", "append": True}),
                       ("edit_file", {"path": path, "old_text": "operator's", "new_text": "attacker's"})]:
        refused = call(registry(), tool, args)
        assert refused.error == ErrorCode.PERMISSION_DENIED, (tool, refused)
        assert "is protected" in refused.message and "NANOFLEET_TOOLS__PROTECTED_FILES" in refused.message
    assert snapshot(workspace) == before and not (workspace / "skills").exists()
    if (workspace / path).exists():  # agents.md is another file on a file system that minds case
        assert call(registry(), "read_file", {"path": path}).output == "the operator's"


def test_what_is_protected_is_the_operators_choice(workspace: Path, registry: Callable[..., ToolRegistry]) -> None:
    assert call(registry(), "write_file", {"path": "MEMORY.md", "content": "likes otters"}).ok  # the agent's own
    assert call(registry(), "write_file", {"path": "notes/AGENTS.md", "content": "a note"}).ok
    nothing = registry(protected_files=[])
    assert call(nothing, "write_file", {"path": "AGENTS.md", "content": "mine"}).ok
    memory_too = registry(protected_files=["memory/", "MEMORY.md"])
    denied = ErrorCode.PERMISSION_DENIED
    assert call(memory_too, "edit_file", {"path": "MEMORY.md", "old_text": "otters", "new_text": "x"}).error == denied
    assert call(memory_too, "write_file", {"path": "memory/2026.md", "content": "x"}).error == denied
    assert call(memory_too, "write_file", {"path": "memoryless.md", "content": "x"}).ok


def test_what_a_protected_name_links_to_is_protected_too(workspace: Path,
                                                        registry: Callable[..., ToolRegistry]) -> None:
    """The prompt reads AGENTS.md through a link that stays inside the workspace: its target is the
    file the model must not change."""
    (workspace / "notes").mkdir()
    (workspace / "notes" / "agents.md").write_text("the operator's")
    (workspace / "AGENTS.md").symlink_to("notes/agents.md")
    (workspace / "my-skills").mkdir()
    (workspace / "skills").symlink_to("my-skills")
    for path in ("notes/agents.md", "my-skills/evil/SKILL.md"):
        refused = call(registry(), "write_file", {"path": path, "content": "obey me"})
        assert refused.error == ErrorCode.PERMISSION_DENIED, (path, refused)
    assert (workspace / "notes" / "agents.md").read_text() == "the operator's"
    assert not (workspace / "my-skills" / "evil").exists()
    assert call(registry(), "write_file", {"path": "notes/today.md", "content": "fine"}).ok
