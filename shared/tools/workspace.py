"""The workspace path guard: every file tool resolves its paths here, and nothing outside gets out."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, Literal

from shared.tools.base import ErrorCode, ToolResult

OpenMode = Literal["rb", "wb", "xb", "ab", "r+b"]
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted in the workspace must fail or return, never hang the worker.
_FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_MODES: dict[str, int] = {
    "rb": os.O_RDONLY,
    "wb": os.O_WRONLY | os.O_CREAT,  # truncated once the checks passed: O_TRUNC would cut a file they refuse
    "xb": os.O_WRONLY | os.O_CREAT | os.O_EXCL,  # a new file only: FileExistsError if there is one
    "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "r+b": os.O_RDWR,
}


class OutsideWorkspace(ValueError):
    """A path that resolves (through `..`, an absolute path or a symlink) outside the workspace."""

    def __init__(self, path: str, reason: str = "is outside the workspace") -> None:
        super().__init__(f"path '{path}' {reason}")
        self.path = path

    def result(self) -> ToolResult:
        return ToolResult.fail(ErrorCode.PERMISSION_DENIED, f"{self}; use a path inside the workspace")


class HardLinked(OutsideWorkspace):
    """A regular file with other names (hard links): one may be outside the workspace (a command can
    `ln /etc/shadow x`, and the file tools may run as a more privileged user than it), and no path
    check can tell where the others are."""

    def __init__(self, path: str, links: int) -> None:
        super().__init__(path, f"is a hard link (the file has {links} names, and one may be outside the workspace)")

    def result(self) -> ToolResult:
        return ToolResult.fail(ErrorCode.PERMISSION_DENIED, f"{self}; the file tools refuse hard-linked files: "
                                                            "copy it (cp) to a file of its own and use that")


class Protected(OutsideWorkspace):
    """A path the file tools may not change: the operator's (NANOFLEET_TOOLS__PROTECTED_FILES)."""

    def __init__(self, path: str, entry: str) -> None:
        super().__init__(path, "is protected" + ("" if entry == path else f" (it is in {entry})"))

    def result(self) -> ToolResult:
        return ToolResult.fail(ErrorCode.PERMISSION_DENIED,
                               f"{self}: it shapes the agent's instructions, so the file tools may read it but not "
                               "change it (NANOFLEET_TOOLS__PROTECTED_FILES); tell the user what to change instead")


class NotAFile(OSError):
    """The path names a folder, a FIFO, a device or a socket where a regular file was expected."""

    def __init__(self, path: Path, *, is_dir: bool) -> None:
        super().__init__("is a folder" if is_dir else "is not a regular file")
        self.path, self.is_dir = path, is_dir


def resolve(workspace: Path, path: str) -> Path:
    """The real path `path` names, relative to the workspace; raise OutsideWorkspace unless it is inside.

    Symlinks are followed as the operating system would (`Path.resolve`), so a link that leads out
    is caught here, whether it is the target itself or a directory on the way. The answer is only
    true at the time of the call: open files with `open_file`, which holds to it.
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


def open_file(workspace: Path, target: Path, mode: OpenMode, *, make_parents: bool = False,
              protected: Sequence[str] = (), owner: tuple[int, int] | None = None) -> BinaryIO:
    """Open the regular file `target` (a path `resolve` answered) without following any symlink.

    Between `resolve` and the open, a folder on the way can be swapped for a symlink that leads
    out. So the file is reached from the workspace one folder at a time, each opened by fd with
    O_NOFOLLOW, the last folder's and the file's real paths are checked again, and a symlink
    found on the way raises OutsideWorkspace. Missing folders are created on the way when
    `make_parents`. A file with other hard links is refused (HardLinked), judged on the open fd.
    Opening for a change a path in `protected` (workspace paths; a folder's covers all below it)
    raises Protected, before anything is made. What this makes (the file, a folder) is given to
    `owner` (uid, gid): exec's user, when commands run as another than the file tools. Raises
    OutsideWorkspace, NotAFile or the OSError of the open.
    """
    root = workspace.resolve()
    if target == root or not target.parent.is_relative_to(root):
        raise NotAFile(target, is_dir=True)
    if mode != "rb":
        _check_unprotected(root, target, protected)
    parent = _open_folder(root, target.parent, make_parents=make_parents, owner=owner)
    try:
        _check_inside(root, parent, target)
        fd = _open_at(parent, target, _MODES[mode], owner=owner)
    finally:
        os.close(parent)
    try:
        _check_regular(fd, target)
        _check_inside(root, fd, target)
        if mode == "wb":
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, mode)


def read_start(workspace: Path, path: str, limit: int) -> tuple[bytes, bool]:
    """The first `limit` bytes of the file `path` (relative to the workspace) and whether it has
    more, for files the system reads by itself (the prompt's files, HEARTBEAT.md, skills): held to
    the guard as `read_file` is, so a symlink that leads out, a FIFO or a device is refused too.
    Raises OutsideWorkspace, NotAFile or the OSError of the open or the read."""
    with open_file(workspace, resolve(workspace, path), "rb") as fh:
        data = fh.read(limit + 1)
    return data[:limit], len(data) > limit


def read_text_start(workspace: Path, path: str, chars: int) -> tuple[str, bool]:
    """read_start for text: the first `chars` characters (read as UTF-8, undecodable bytes
    replaced) and whether the file has more. Raises as read_start."""
    data, more = read_start(workspace, path, 4 * chars)  # a character is at most 4 bytes of UTF-8
    text = data.decode(errors="replace")
    return text[:chars], more or len(text) > chars


def open_folder(workspace: Path, target: Path) -> int:
    """An fd on the folder `target` (a path `resolve` answered), reached as `open_file` reaches
    files; the caller closes it. Raises OutsideWorkspace or the OSError of the open."""
    root = workspace.resolve()
    fd = _open_folder(root, target, make_parents=False)
    try:
        _check_inside(root, fd, target)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_folder(root: Path, folder: Path, *, make_parents: bool, owner: tuple[int, int] | None = None) -> int:
    """An fd on `folder`, walked down to from `root` without following a symlink; a folder made on
    the way is given to `owner`."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in folder.relative_to(root).parts:
            if make_parents:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_fd=fd)
                    if owner is not None:
                        os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
            next_fd = _open_at(fd, folder, _DIR_FLAGS, name=name)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_at(dir_fd: int, target: Path, flags: int, *, name: str | None = None,
             owner: tuple[int, int] | None = None) -> int:
    """os.open relative to `dir_fd` with O_NOFOLLOW; a symlink where none was resolved is refused.
    A file it creates is given to `owner` (one that was there keeps its own)."""
    name, made = name or target.name, False
    try:
        if owner is not None and flags & os.O_CREAT:
            try:
                fd, made = os.open(name, flags | os.O_EXCL | _FILE_FLAGS, 0o666, dir_fd=dir_fd), True
            except FileExistsError:
                if flags & os.O_EXCL:
                    raise
                fd = os.open(name, flags | _FILE_FLAGS, 0o666, dir_fd=dir_fd)
        else:
            fd = os.open(name, flags | _FILE_FLAGS, 0o666, dir_fd=dir_fd)
    except OSError as err:
        # ELOOP: the last component is a symlink; ENOTDIR: it may be a symlink where a folder was.
        if err.errno == errno.ELOOP or (err.errno == errno.ENOTDIR and _is_link(dir_fd, name)):
            raise OutsideWorkspace(str(target), "changed to a symlink while it was opened") from err
        if err.errno == errno.EISDIR:
            raise NotAFile(target, is_dir=True) from err
        raise
    if made and owner is not None:
        try:
            os.fchown(fd, *owner)
        except BaseException:
            os.close(fd)
            raise
    return fd


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _check_regular(fd: int, target: Path) -> None:
    """A regular file with one name: the fd's, so a link made after a path check cannot slip by."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotAFile(target, is_dir=stat.S_ISDIR(st.st_mode))
    if st.st_nlink > 1:
        raise HardLinked(str(target), st.st_nlink)


def _check_unprotected(root: Path, target: Path, protected: Sequence[str]) -> None:
    """`target` is a real path (symlinks resolved): a link to a protected file is that file, and so is
    the file a protected name links to (AGENTS.md -> notes/agents.md protects notes/agents.md). Case
    is ignored, for file systems that ignore it (agents.md is AGENTS.md there)."""
    path = target.relative_to(root)
    folded = Path(path.as_posix().casefold())
    for entry in protected:
        if folded.is_relative_to(entry.casefold()) or target.is_relative_to((root / entry).resolve()):
            raise Protected(path.as_posix(), entry)


def _check_inside(root: Path, fd: int, target: Path) -> None:
    """Refuse an fd whose real path (as the kernel tracks it) is outside the workspace: it catches a
    folder moved out of the workspace while the walk held it."""
    try:
        real = Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:  # no /proc (not Linux): the O_NOFOLLOW walk alone holds the line
        return
    if real != root and not real.is_relative_to(root):
        raise OutsideWorkspace(str(target), "leads outside the workspace while it was opened")
