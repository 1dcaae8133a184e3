"""Files users send, kept in the workspace: names any disk takes, the same file never written twice,
another of the same name beside it, and an inbox that leads out of the workspace refused."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from shared.channels import files, saved
from shared.contracts import InboundMessage

DAY = date(2026, 11, 29)


@pytest.mark.parametrize(("name", "kept"), [
    ("report.xlsx", "report.xlsx"), ("../../etc/passwd", "passwd"), ("C:\\Users\\ann\\q3.csv", "q3.csv"),
    ("..hidden", "hidden"), ("..", "file"), ("", "file"), ("line\nbreak\t.txt", "linebreak.txt"),
    ("x" * 300 + ".tar.gz", "x" * (saved.MAX_NAME - 3) + ".gz"), ("noext", "noext")])
def test_names_are_cleaned(name: str, kept: str) -> None:
    assert saved.clean(name) == kept


def test_a_file_is_kept_once_and_another_of_its_name_beside_it(tmp_path: Path) -> None:
    first = saved.save(tmp_path, "data.xlsx", b"one", DAY)
    assert first == "inbox/2026-11-29/data.xlsx" and (tmp_path / first).read_bytes() == b"one"
    assert saved.save(tmp_path, "data.xlsx", b"one", DAY) == first  # a retry: found, not written again
    other = saved.save(tmp_path, "data.xlsx", b"two", DAY)
    assert other == "inbox/2026-11-29/data-2.xlsx" and (tmp_path / other).read_bytes() == b"two"
    assert saved.save(tmp_path, "data.xlsx", b"one!", DAY) == "inbox/2026-11-29/data-3.xlsx"  # not a prefix match
    assert saved.save(tmp_path, "data.xlsx", b"two", DAY) == other


def test_an_inbox_that_leads_out_of_the_workspace_is_refused(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (workspace / "inbox").symlink_to(outside)
    with pytest.raises(saved.NotKept):
        saved.save(workspace, "a.txt", b"x", DAY)
    assert list(outside.iterdir()) == []


def test_a_kept_file_the_model_cannot_read_still_goes_to_it_with_its_place() -> None:
    msg = InboundMessage(channel="telegram", chat_id="1", sender_id="2", content="", event_id="e",
                         media={"kind": "file", "name": "data.xlsx"})
    unread = files.read(msg, b"PK\x03\x04\x00binary", "f", kept="inbox/2026-11-29/data.xlsx")
    assert unread.notice is None and unread.content == (
        "[file data.xlsx: not read, it is neither a PDF nor a text file; saved as inbox/2026-11-29/data.xlsx]")
    assert files.read(msg, b"a,b", "f", kept="inbox/x/data.csv").content == \
        "[file data.xlsx; saved as inbox/x/data.csv]\na,b"
    assert files.read(msg, b"PK\x03\x04\x00binary", "f").notice is not None  # not kept: the notice, as before
