"""The workspace path guard: every file tool resolves its paths here, and nothing outside gets out."""

from __future__ import annotations

import os
from pathlib import Path

from shared.tools.base import ErrorCode, ToolResult


class OutsideWorkspace(ValueError):
    """A path that resolves (through `..`, an absolute path or a symlink) outside the workspace."""

    def __init__(self, path: str, reason: str = "is outside the workspace") -> None:
        super().__init__(f"path '{path}' {reason}")
        self.path = path

    def result(self) -> ToolResult:
        return ToolResult.fail(ErrorCode.PERMISSION_DENIED, f"{self}; use a path inside the workspace")


def resolve(workspace: Path, path: str) -> Path:
    """The real path `path` names, relative to the workspace; raise OutsideWorkspace unless it is inside.

    Symlinks are followed as the operating system would (`Path.resolve`), so a link that leads out
    is caught here, whether it is the target itself or a directory on the way.
    """
    if "\x00" in path:
        raise OutsideWorkspace(path.replace("\x00", "\\0"), "contains a NUL byte")
    root = workspace.resolve()
    candidate = Path(os.path.expanduser(path)) if path.startswith("~") else Path(path)
    try:
        target = (root / candidate).resolve()
    except (OSError, RuntimeError) as err:  # symlink loops, over-long names
        raise OutsideWorkspace(path, f"cannot be resolved ({err})") from err
    if target != root and not target.is_relative_to(root):
        raise OutsideWorkspace(path)
    return target


def display(workspace: Path, target: Path) -> str:
    """A resolved path as the model should see it: relative to the workspace."""
    root = workspace.resolve()
    return "." if target == root else str(target.relative_to(root))
