"""Files users send, kept in the workspace: names any disk takes, the same file never written twice,
another of the same name beside it, and an inbox that leads out of the workspace refused; what the
model is told of a kept photo or audio file."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from types import SimpleNamespace

import pytest

from shared.channels import files, images, saved, voice
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


def _message(content: str, kind: str) -> InboundMessage:
    return InboundMessage(channel="telegram", chat_id="1", sender_id="2", content=content, event_id="e1",
                          media={"kind": kind, "id": "f1"}, unsupported=f"a {kind}")


def test_a_kept_photo_a_model_sees_goes_with_its_place_and_one_it_cannot_goes_alone_too() -> None:
    jpeg = b"\xff\xd8\xff\xe0" + bytes(16)
    seen = images.attached(_message("crop this", "photo"), jpeg, "inbox/2026-11-29/p.jpg")
    assert seen.content == "crop this\n\n[photo saved as inbox/2026-11-29/p.jpg]" and len(seen.images) == 1
    assert seen.unsupported is None and seen.media is None
    alone = images.unseen_kept(_message("", "photo"), "inbox/2026-11-29/p.jpg")
    assert alone.content == "[The user sent a photo, saved as inbox/2026-11-29/p.jpg; you cannot see images.]"
    assert alone.unsupported is None and alone.notice is None  # to the model, not a notice
    assert images.named("AgADBAAD", jpeg) == "AgADBAAD.jpg" and images.named("file_7.jpg", jpeg) == "file_7.jpg"
    assert images.named("media1", b"not an image") == "media1"


def test_kept_audio_is_named_to_the_model_transcribed_or_not() -> None:
    heard = SimpleNamespace(llm=SimpleNamespace(transcribe=lambda audio, name: "call me back"))
    said = voice.transcribed(heard, _message("", "voice"), b"OggS", "v.oga", kept="inbox/2026-11-29/v.oga")  # type: ignore[arg-type]
    assert said.content == "[voice message, saved as inbox/2026-11-29/v.oga] call me back"
    unheard = voice.untranscribed(_message("listen", "audio"), "inbox/2026-11-29/a.mp3")
    assert unheard.content == ("listen\n\n[The user sent an audio file, saved as inbox/2026-11-29/a.mp3; "
                               "it was not transcribed.]")
    assert unheard.unsupported is None and unheard.media is None


def test_prune_deletes_the_inbox_days_before_the_cutoff_and_follows_no_link(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "precious.txt").write_text("mine")
    for day, name in (("2026-10-01", "a.pdf"), ("2026-10-01", "b.jpg"), ("2026-11-28", "c.oga")):
        saved.save(workspace, name, name.encode(), date.fromisoformat(day))
    (workspace / "inbox" / "2026-10-01" / "sub").mkdir()
    (workspace / "inbox" / "2026-10-01" / "sub" / "d.txt").write_text("d")
    (workspace / "inbox" / "2026-10-01" / "escape").symlink_to(outside)  # deleted as a link, not entered
    (workspace / "inbox" / "2026-09-30").symlink_to(outside)  # a day that is a link: left, not followed
    (workspace / "inbox" / "notes").mkdir()  # not a day: not the inbox's
    assert saved.prune(workspace, date(2026, 11, 1)) == 4
    assert sorted(p.name for p in (workspace / "inbox").iterdir()) == ["2026-09-30", "2026-11-28", "notes"]
    assert (outside / "precious.txt").read_text() == "mine"
    assert saved.prune(workspace, date(2026, 11, 1)) == 0


def test_prune_leaves_an_inbox_that_is_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    (outside / "2026-01-01").mkdir(parents=True)
    (outside / "2026-01-01" / "x.txt").write_text("x")
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "inbox").symlink_to(outside)
    assert saved.prune(tmp_path / "ws", date(2026, 11, 1)) == 0
    assert (outside / "2026-01-01" / "x.txt").exists()
    assert saved.prune(tmp_path / "nowhere", date(2026, 11, 1)) == 0  # no inbox yet


def test_a_file_kept_by_another_worker_meanwhile_is_not_overwritten(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers keep different files of one name at once: each found no file there, and the second
    to create it must not write over the first's."""
    from shared.tools import workspace

    assert saved.save(tmp_path, "image.png", b"first user's", DAY) == "inbox/2026-11-29/image.png"
    real = workspace.read_start

    def not_there_yet(root: Path, path: str, limit: int) -> tuple[bytes, bool]:
        if path.endswith("/image.png"):  # as it was when the other worker looked
            raise FileNotFoundError(path)
        return real(root, path, limit)

    monkeypatch.setattr(workspace, "read_start", not_there_yet)
    assert saved.save(tmp_path, "image.png", b"second user's", DAY) == "inbox/2026-11-29/image-2.png"
    assert (tmp_path / "inbox/2026-11-29/image.png").read_bytes() == b"first user's"
