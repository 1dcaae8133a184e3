"""message with files: workspace files read once, kept in Postgres (sent_files) and queued after the
text as rows of their own; refused with a clear error when the permission, the path or the size says no."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlmodel import Session, select

from shared.db import get_engine
from shared.models import Run, SentFile
from shared.outbox import FILE
from shared.tool_settings import MessageSettings
from shared.tools import build_registry
from shared.tools.base import ErrorCode
from shared.tools.registry import ToolRegistry
from tests.shared.tools.conftest import tool_settings
from tests.shared.tools.test_message import configured, rows, send, suppressed
from tests.support.stack import clean_db

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


@pytest.fixture
def reg(database_url: str, workspace: Path) -> ToolRegistry:
    clean_db(database_url)
    (workspace / "report.csv").write_bytes(b"a,b\n1,2\n")
    (workspace / "chart.bin").write_bytes(PNG)  # a photo whatever its name says
    return build_registry(configured(tool_settings(workspace, allowed=["message"], granted=["FS_READ"]),
                                     database_url))


def files(database_url: str) -> list[SentFile]:
    with Session(get_engine(database_url)) as s:
        return list(s.exec(select(SentFile).order_by(SentFile.name)))


def test_files_go_after_the_text_each_a_row_naming_its_stored_file(reg: ToolRegistry, make_run: Callable[..., Run],
                                                                   database_url: str) -> None:
    run = make_run()
    result, ctx = send(reg, run, {"content": "Here you go.", "files": ["report.csv", "chart.bin"]})
    assert result.ok and "2 file(s)" in result.output
    text, *sent = sorted(rows(database_url), key=lambda r: r.meta["chunk"])
    assert (text.content, text.meta["chunks"]) == ("Here you go.", 3)
    stored = {f.id: f for f in files(database_url)}
    assert [(r.content, r.meta[FILE]["name"], r.meta[FILE]["mime"]) for r in sent] == [
        ("", "report.csv", "text/csv"), ("", "chart.bin", "image/png")]
    assert [stored[r.meta[FILE]["id"]].data for r in sent] == [b"a,b\n1,2\n", PNG]
    assert all(f.conversation_id == run.conversation_id for f in stored.values())
    assert len(ctx.followups) == 3 and suppressed(database_url, run.id)


def test_files_alone_and_a_replay_stores_nothing_twice(reg: ToolRegistry, make_run: Callable[..., Run],
                                                       database_url: str) -> None:
    run = make_run()
    for _ in range(2):
        assert send(reg, run, {"files": ["report.csv"]})[0].ok
    assert [(r.meta["chunk"], r.meta["chunks"]) for r in rows(database_url)] == [(0, 1)]
    assert len(files(database_url)) == 1


def test_refusals_store_nothing(reg: ToolRegistry, make_run: Callable[..., Run], database_url: str,
                                workspace: Path, tmp_path: Path) -> None:
    run = make_run()
    (tmp_path / "secret.txt").write_text("no")
    (workspace / "folder").mkdir()
    (workspace / "link.txt").symlink_to(tmp_path / "secret.txt")
    for path, code in (("../secret.txt", ErrorCode.PERMISSION_DENIED), ("link.txt", ErrorCode.PERMISSION_DENIED),
                       ("missing.pdf", ErrorCode.NOT_FOUND), ("folder", ErrorCode.INVALID_ARGS)):
        result = send(reg, run, {"content": "x", "files": ["report.csv", path]})[0]
        assert result.error == code, (path, result)
    assert send(reg, run, {"content": " "})[0].error == ErrorCode.INVALID_ARGS  # neither text nor files
    assert send(reg, run, {"files": ["report.csv"] * 11})[0].error == ErrorCode.INVALID_ARGS
    assert rows(database_url) == [] and files(database_url) == [] and not suppressed(database_url, run.id)


def test_a_file_over_the_limit_is_too_large(database_url: str, workspace: Path,
                                           make_run: Callable[..., Run]) -> None:
    clean_db(database_url)
    (workspace / "big.log").write_bytes(b"x" * 101)
    (workspace / "fits.log").write_bytes(b"x" * 100)
    settings = configured(tool_settings(workspace, allowed=["message"], granted=["FS_READ"]), database_url)
    tools = settings.tools.model_copy(update={"message": MessageSettings(max_file_bytes=100)})
    reg = build_registry(settings.model_copy(update={"tools": tools}))
    run = make_run()
    too_large = send(reg, run, {"files": ["fits.log", "big.log"]})[0]
    assert too_large.error == ErrorCode.TOO_LARGE and "100 bytes" in too_large.message
    assert "NANOFLEET_TOOLS__MESSAGE__MAX_FILE_BYTES" in too_large.message  # (ours: not telegram's)
    assert rows(database_url) == []
    assert send(reg, run, {"files": ["fits.log"]}, call_id="call_2")[0].ok


def test_a_file_over_the_platform_s_smaller_limit_names_the_platform(database_url: str, workspace: Path,
                                                                    make_run: Callable[..., Run]) -> None:
    clean_db(database_url)
    with (workspace / "huge.bin").open("wb") as f:  # (sparse: one byte over what a Telegram bot may upload)
        f.truncate(50 * 1024 * 1024 + 1)
    settings = configured(tool_settings(workspace, allowed=["message"], granted=["FS_READ"]), database_url)
    tools = settings.tools.model_copy(update={"message": MessageSettings(max_file_bytes=60 * 1024 * 1024)})
    run = make_run()
    too_large = send(build_registry(settings.model_copy(update={"tools": tools})), run, {"files": ["huge.bin"]})[0]
    assert too_large.error == ErrorCode.TOO_LARGE and run.origin["channel"] == "telegram"
    assert too_large.message == "huge.bin is larger than 52,428,800 bytes, the most that can be sent to telegram"


def test_files_need_fs_read(database_url: str, workspace: Path, make_run: Callable[..., Run]) -> None:
    clean_db(database_url)
    (workspace / "report.csv").write_text("a")
    reg = build_registry(configured(tool_settings(workspace, allowed=["message"], granted=[]), database_url))
    run = make_run()
    denied = send(reg, run, {"content": "x", "files": ["report.csv"]})[0]
    assert denied.status == "REJECTED" and "FS_READ" in denied.message
    assert send(reg, run, {"content": "text needs no permission"}, call_id="call_2")[0].ok


def test_an_api_caller_gets_links_to_the_files(reg: ToolRegistry, make_run: Callable[..., Run],
                                               database_url: str) -> None:
    run = make_run(origin={"channel": "api", "chat_id": "conv-1"})
    result, _ = send(reg, run, {"content": "the chart", "files": ["chart.bin"]})
    [stored] = files(database_url)
    assert result.output["files"] == [{"id": stored.id, "name": "chart.bin", "mime": "image/png", "size": len(PNG),
                                       "url": f"/api/v1/files/{stored.id}"}]
    assert stored.data == PNG and rows(database_url) == []
