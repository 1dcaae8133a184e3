"""read_file, write_file, edit_file and list_dir through the real registry."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from shared.agent.runtime import Runtime
from shared.aio import run_sync
from shared.tools import edit_file
from shared.tools.base import ErrorCode, ToolContext
from shared.tools.edit_file import MAX_HINT_NEEDLE
from shared.tools.registry import ToolRegistry
from tests.shared.tools.conftest import call, deep_folder, tool_settings


@pytest.fixture
def reg(registry: Callable[..., ToolRegistry]) -> ToolRegistry:
    return registry(allowed=["read_file", "write_file", "edit_file", "list_dir"])


def test_write_creates_parents_and_appends(reg: ToolRegistry, workspace: Path) -> None:
    assert call(reg, "write_file", {"path": "notes/2026/today.md", "content": "one\n"}).ok
    assert call(reg, "write_file", {"path": "notes/2026/today.md", "content": "two\n", "append": True}).ok
    assert (workspace / "notes/2026/today.md").read_text() == "one\ntwo\n"
    assert call(reg, "write_file", {"path": "notes/2026/today.md", "content": "new"}).ok
    assert (workspace / "notes/2026/today.md").read_text() == "new"
    assert call(reg, "write_file", {"path": "notes", "content": "x"}).error == ErrorCode.INVALID_ARGS
    # a folder's name was written as a file of that name
    assert call(reg, "write_file", {"path": "drafts/", "content": "x"}).error == ErrorCode.INVALID_ARGS
    assert not (workspace / "drafts").exists()


def test_read_whole_file_and_line_ranges(reg: ToolRegistry, workspace: Path) -> None:
    (workspace / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    assert call(reg, "read_file", {"path": "f.txt"}).output.startswith("line 1\nline 2\n")
    assert call(reg, "read_file", {"path": "f.txt", "start_line": 3, "end_line": 4}).output == "line 3\nline 4\n"
    assert call(reg, "read_file", {"path": "f.txt", "start_line": 10}).output == "line 10\n"
    assert call(reg, "read_file", {"path": "f.txt", "start_line": 5, "end_line": 2}).error == ErrorCode.INVALID_ARGS
    assert call(reg, "read_file", {"path": "missing.txt"}).error == ErrorCode.NOT_FOUND
    (workspace / "bin.dat").write_bytes(b"\x00\x01\x02")
    assert call(reg, "read_file", {"path": "bin.dat"}).error == ErrorCode.INVALID_ARGS


def test_read_cuts_long_files_with_a_hint(reg: ToolRegistry, workspace: Path) -> None:
    (workspace / "long.txt").write_text("x" * 80 + "\n" * 1 + "y" * 80_000)
    out = call(reg, "read_file", {"path": "long.txt"}).output
    assert out == "x" * 80 + "\n[cut off after line 1 of 2: read on with start_line=2]"
    out = call(reg, "read_file", {"path": "long.txt", "start_line": 2}).output
    assert out.startswith("y" * 100) and out.endswith("[line 2 is cut off at 60,000 bytes; the file has 2 lines: "
                                                    "read on with start_line=3]")


def test_text_of_many_bytes_a_character_is_cut_at_a_line_with_the_hint(reg: ToolRegistry, workspace: Path) -> None:
    """44,500 Cyrillic characters are 89,000 bytes: the output cap (in bytes) cut them without the hint."""
    lines = [f"{i:04d} " + "привет мир " * 4 for i in range(1, 1001)]
    (workspace / "ru.txt").write_text("\n".join(lines) + "\n")
    first = call(reg, "read_file", {"path": "ru.txt"})
    assert first.ok and "[output truncated" not in first.output
    shown, _, note = first.output.rpartition("\n[")
    last = len(shown.splitlines())
    assert shown.splitlines() == lines[:last] and note == f"cut off after line {last} of 1000: read on with " \
        f"start_line={last + 1}]"
    rest = call(reg, "read_file", {"path": "ru.txt", "start_line": last + 1}).output
    assert rest.splitlines()[0] == lines[last]


def test_read_past_the_last_line_says_how_many_lines_there_are(reg: ToolRegistry, workspace: Path) -> None:
    (workspace / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))  # wc -l: 10
    past = call(reg, "read_file", {"path": "f.txt", "start_line": 11})
    assert past.error == ErrorCode.INVALID_ARGS and past.message == "start_line 11 is past the end: f.txt has 10 lines"
    assert call(reg, "read_file", {"path": "f.txt", "start_line": 10, "end_line": 99}).output == "line 10\n"
    (workspace / "two.txt").write_text("a\nb")
    assert "two.txt has 2 lines" in call(reg, "read_file", {"path": "two.txt", "start_line": 3}).message
    (workspace / "empty.txt").write_text("")
    assert call(reg, "read_file", {"path": "empty.txt", "start_line": 1}).output == ""
    assert "has 0 lines" in call(reg, "read_file", {"path": "empty.txt", "start_line": 2}).message


def test_edit_refuses_a_file_that_is_not_utf8_and_leaves_it_alone(reg: ToolRegistry, workspace: Path) -> None:
    path = workspace / "latin1.txt"
    path.write_bytes("café naïve\nline two ändern\n".encode("latin-1"))
    result = call(reg, "edit_file", {"path": "latin1.txt", "old_text": "line two", "new_text": "line 2"})
    assert result.error == ErrorCode.INVALID_ARGS and "not UTF-8" in result.message
    assert path.read_bytes() == "café naïve\nline two ändern\n".encode("latin-1")


def test_edit_needs_a_unique_match_unless_replace_all(reg: ToolRegistry, workspace: Path) -> None:
    path = workspace / "code.py"
    path.write_text("a = 1\nb = 1\nprint(a + b)\n")
    assert call(reg, "edit_file", {"path": "code.py", "old_text": "a = 1", "new_text": "a = 2"}).ok
    assert path.read_text() == "a = 2\nb = 1\nprint(a + b)\n"
    twice = call(reg, "edit_file", {"path": "code.py", "old_text": " = ", "new_text": "="})
    assert twice.error == ErrorCode.INVALID_ARGS and "2 times" in twice.message
    assert path.read_text() == "a = 2\nb = 1\nprint(a + b)\n"
    assert call(reg, "edit_file", {"path": "code.py", "old_text": " = ", "new_text": "=", "replace_all": True}).ok
    assert path.read_text() == "a=2\nb=1\nprint(a + b)\n"


@pytest.mark.parametrize(("text", "old_text"), [("aaa\n", "aa"), ("end\nend\nend\n", "end\nend")])
def test_edit_counts_overlapping_matches_as_ambiguous(reg: ToolRegistry, workspace: Path, text: str,
                                                     old_text: str) -> None:
    """str.count finds one "aa" in "aaa": the edit would pick one of two places without saying so."""
    path = workspace / "f.txt"
    path.write_text(text)
    result = call(reg, "edit_file", {"path": "f.txt", "old_text": old_text, "new_text": "X"})
    assert result.error == ErrorCode.INVALID_ARGS and "old_text occurs 2 times in f.txt" in result.message
    assert path.read_text() == text
    everywhere = call(reg, "edit_file", {"path": "f.txt", "old_text": old_text, "new_text": "X", "replace_all": True})
    assert everywhere.output.startswith("replaced 1 occurrence in") and path.read_text() == text.replace(old_text, "X")


def test_edit_of_a_folder_says_it_is_a_folder(reg: ToolRegistry, workspace: Path) -> None:
    (workspace / "notes").mkdir()
    result = call(reg, "edit_file", {"path": "notes", "old_text": "a", "new_text": "b"})
    assert result.error == ErrorCode.INVALID_ARGS and result.message == "notes is a folder, not a file"


def test_edit_miss_answers_with_the_closest_match(reg: ToolRegistry, workspace: Path) -> None:
    (workspace / "cfg.toml").write_text("[server]\nport = 8080\nhost = \"0.0.0.0\"\n")
    result = call(reg, "edit_file", {"path": "cfg.toml", "old_text": "prot = 8080", "new_text": "port = 9090"})
    assert result.error == ErrorCode.NOT_FOUND
    assert "line 2" in result.message and "port = 8080" in result.message
    assert call(reg, "edit_file", {"path": "nope.toml", "old_text": "a", "new_text": "b"}).error == ErrorCode.NOT_FOUND


def test_edit_miss_of_a_long_needle_skips_the_costly_hint(reg: ToolRegistry, workspace: Path) -> None:
    (workspace / "f.py").write_text("".join(f"value_{i} = compute(alpha, beta, gamma)\n" for i in range(40)))
    needle = "".join(f"value_{i} = compute(alpha, beta, delta)\n" for i in range(MAX_HINT_NEEDLE // 30))
    result = call(reg, "edit_file", {"path": "f.py", "old_text": needle, "new_text": "x"})
    assert result.error == ErrorCode.NOT_FOUND and "closest match" not in result.message


def test_edit_hint_leaves_the_event_loop_free(reg: ToolRegistry, workspace: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Tools share one event loop per worker: the hint must not hold it while it searches."""
    (workspace / "cfg.toml").write_text("port = 8080\n")
    started, release, released = threading.Event(), threading.Event(), []

    def slow_hint(text: str, needle: str) -> None:
        started.set()
        released.append(release.wait(5))  # only the event loop can set it, and only if it is free

    async def releaser() -> None:
        while not started.is_set():
            await asyncio.sleep(0.01)
        release.set()

    async def both() -> None:
        ctx = ToolContext(settings=reg.settings)
        await asyncio.gather(reg.execute("edit_file", {"path": "cfg.toml", "old_text": "prot", "new_text": "x"},
                                         ctx), releaser())

    monkeypatch.setattr(edit_file, "closest_match", slow_hint)
    run_sync(both(), timeout=30)
    assert released == [True]


def test_list_dir_recursive_pattern_and_bound(reg: ToolRegistry, workspace: Path) -> None:
    (workspace / "docs" / "deep").mkdir(parents=True)
    (workspace / "docs" / "a.md").write_text("")
    (workspace / "docs" / "deep" / "b.md").write_text("")
    (workspace / "docs" / "c.txt").write_text("")
    assert call(reg, "list_dir", {"path": "docs"}).output.splitlines() == ["a.md", "c.txt", "deep/"]
    listing = call(reg, "list_dir", {"path": ".", "recursive": True, "pattern": "*.md"}).output
    assert listing.splitlines() == ["docs/a.md", "docs/deep/b.md"]
    for i in range(30):
        (workspace / f"f{i:02}").write_text("")
    bounded = call(reg, "list_dir", {"max_entries": 5}).output.splitlines()
    assert len(bounded) == 6 and bounded[-1].startswith("[26 more entries not shown")
    assert call(reg, "list_dir", {"path": "docs/a.md"}).error == ErrorCode.INVALID_ARGS
    assert call(reg, "list_dir", {"path": "nothing"}).error == ErrorCode.NOT_FOUND


def test_list_dir_shows_a_link_to_a_folder_as_no_folder(reg: ToolRegistry, workspace: Path, tmp_path: Path) -> None:
    """Recursive listings marked it `out/`, inviting a listing the sandbox then refused; the plain
    listing already showed it as `out`."""
    (tmp_path / "elsewhere").mkdir()
    (workspace / "docs").mkdir()
    (workspace / "docs" / "out").symlink_to(tmp_path / "elsewhere")
    assert call(reg, "list_dir", {"path": "docs"}).output == "out"
    assert call(reg, "list_dir", {"path": ".", "recursive": True}).output.splitlines() == ["docs/", "docs/out"]


def test_list_dir_of_a_path_too_long_to_use_fails_cleanly(reg: ToolRegistry, workspace: Path) -> None:
    """write_file makes folders by descriptor, past PATH_MAX; list_dir raised (a traceback in the
    worker's log, the workspace's absolute path shown to the model)."""
    deep = deep_folder(workspace)
    result = call(reg, "list_dir", {"path": deep})
    assert result.error == ErrorCode.FAILED and "File name too long" in str(result.message), result
    assert str(workspace) not in str(result.message)


def test_read_file_serves_builtin_skills_unless_the_workspace_has_them(reg: ToolRegistry, workspace: Path) -> None:
    builtin = call(reg, "read_file", {"path": "skills/github/SKILL.md"})
    assert builtin.ok and "gh" in builtin.output
    (workspace / "skills" / "github").mkdir(parents=True)
    (workspace / "skills" / "github" / "SKILL.md").write_text("---\nname: github\n---\nmine")
    assert call(reg, "read_file", {"path": "skills/github/SKILL.md"}).output.endswith("mine")
    assert call(reg, "read_file", {"path": "skills/../../etc/passwd"}).status == "REJECTED"


def test_a_fresh_install_can_write_before_anything_made_the_workspace(tmp_path: Path) -> None:
    """The runtime (worker, gateway, `nanofleet agent`) makes the workspace; file tools used to
    answer "No such file or directory" on a fresh install until the exec tool happened to run."""
    fresh = tmp_path / "home" / ".nanofleet" / "workspace"
    rt = Runtime.build(tool_settings(fresh, allowed=["write_file", "list_dir"]))
    assert call(rt.tools, "write_file", {"path": "todo.md", "content": "- milk\n"}).ok
    assert (fresh / "todo.md").read_text() == "- milk\n"
    assert "todo.md" in str(call(rt.tools, "list_dir", {"path": "."}).output)
