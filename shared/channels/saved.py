"""Files users send, kept in the workspace (NANOFLEET_CHANNELS__SAVE_FILES), so that the agent's file
tools and commands can open what it could not read as text: a spreadsheet, an archive, a scan.

A file goes under inbox/<date>/<its name>. The same file arriving again (a platform's retry, a fetch
done twice) finds itself there and is not written twice; another file of the same name that day gets
-2, -3... before its extension. With NANOFLEET_CHANNELS__SAVE_FILES_DAYS, a day's folder is deleted
once it is that many days old (`prune`, by the retention pass)."""

from __future__ import annotations

import logging
import re
import shutil
from datetime import date
from pathlib import Path

log = logging.getLogger(__name__)
INBOX = "inbox"
MAX_NAME = 120  # characters of a kept file's name
TRIES = 100  # names tried, name-2 to name-100, before the day's folder is called full


class NotKept(Exception):
    """The file could not be kept: the disk refused, the inbox leads out of the workspace (a
    symlink), or a hundred different files of one name came that day."""


def save(workspace: Path, name: str, data: bytes, day: date) -> str:
    """Keep `data` under a free name in the day's inbox (or where it already is); its workspace path.
    Raises NotKept."""
    from shared.tools.workspace import OutsideWorkspace, open_file, read_start, resolve  # (the tools import us)

    stem, ext = _split(clean(name))
    try:
        for n in range(1, TRIES + 1):
            path = f"{INBOX}/{day.isoformat()}/{stem}{f'-{n}' if n > 1 else ''}{ext}"
            try:
                if read_start(workspace, path, len(data)) == (data, False):
                    return path
            except FileNotFoundError:
                try:  # a new file only: another worker may be keeping one of this name this moment
                    with open_file(workspace, resolve(workspace, path), "xb", make_parents=True) as fh:
                        fh.write(data)
                except FileExistsError:
                    continue
                return path
    except (OutsideWorkspace, OSError) as err:
        raise NotKept(str(err)) from err
    raise NotKept(f"{INBOX}/{day.isoformat()} already has {TRIES} files named {stem}{ext}")


def prune(workspace: Path, before: date) -> int:
    """Delete the inbox's day folders older than `before` (a folder named otherwise is not the
    inbox's, and stays); how many files went. A link in a day's folder is deleted, never followed; a
    day's folder that is a link, or an inbox that is one, is left alone."""
    inbox = workspace / INBOX
    if inbox.is_symlink() or not inbox.is_dir():
        if inbox.is_symlink():
            log.warning("the inbox %s is a symbolic link: kept files are not deleted there", inbox)
        return 0
    deleted = 0
    for folder in sorted(inbox.iterdir()):
        if folder.is_symlink() or not folder.is_dir() or not _older(folder.name, before):
            continue
        files = sum(1 for p in folder.rglob("*") if not p.is_dir() or p.is_symlink())
        try:
            shutil.rmtree(folder)
        except OSError as err:
            log.warning("kept files in %s not deleted: %s", folder, err)
            continue
        deleted += files
    return deleted


def _older(name: str, before: date) -> bool:
    try:
        return date.fromisoformat(name) < before
    except ValueError:
        return False


def clean(name: str) -> str:
    """A name the file can have on any disk: the last part of a path, no control characters, no
    leading dots (hidden, or `..`), at most MAX_NAME characters with its extension kept."""
    base = re.split(r"[/\\]", name)[-1]
    base = re.sub(r"[\x00-\x1f\x7f]", "", base).strip().lstrip(".").strip()
    if not base:
        return "file"
    stem, ext = _split(base)
    ext = ext[:20]
    return stem[:MAX_NAME - len(ext)] + ext


def _split(name: str) -> tuple[str, str]:
    stem, dot, ext = name.rpartition(".")
    return (stem, dot + ext) if stem and dot else (name, "")
