"""The text of files sent in chats (shared.channels.files), in-process: what the model is given, and
what the sender is told when there is none."""

from __future__ import annotations

from shared.channels import files
from shared.contracts import InboundMessage
from tests.support.documents import pdf


def msg(caption: str = "", name: str = "notes.txt") -> InboundMessage:
    return InboundMessage(channel="telegram", chat_id="1", sender_id="1", content=caption, event_id="e",
                          unsupported=None if caption else "a file", media={"kind": "file", "id": "f", "name": name})


def test_a_pdf_s_pages_and_a_text_file_are_read_after_the_caption() -> None:
    read = files.read(msg("sum it up", "q3 \n report.pdf"), pdf("Revenue rose", "", "Costs fell"), "f.bin")
    assert read.content == "sum it up\n\n[file q3 report.pdf]\nRevenue rose\n\nCosts fell"
    assert (read.media, read.unsupported, read.notice) == (None, None, None)
    for encoded in ("naïve café".encode(), "naïve café".encode("utf-16"), b"\xef\xbb\xbfna\xc3\xafve caf\xc3\xa9"):
        assert files.read(msg(), encoded, "f").content == "[file notes.txt]\nnaïve café"
    assert files.read(msg(name=""), b"x", "AgAD.txt").content == "[file AgAD.txt]\nx"  # the platform's name


def test_a_long_text_is_cut_saying_how_much_is_left_out() -> None:
    read = files.read(msg(), b"a" * (files.MAX_CHARS + 1234), "f")
    assert read.content.endswith("a" * 10 + "\n[... not shown: 1,234 more characters]")
    assert len(read.content) < files.MAX_CHARS + 100
    page = "b" * 3000  # pages are read until MAX_CHARS are: 7 of them (and 6 blank lines), 5 left unread
    long = files.read(msg(), pdf(*[page] * 12), "f").content
    assert long.endswith("b\n[... not shown: 1,012 more characters and 5 more page(s)]")
    assert long.count("b") == files.MAX_CHARS - 12


def test_a_file_without_text_gets_a_notice_or_its_caption_says_so() -> None:
    cases = {b"PK\x03\x04\x00\x00binary": "it is neither a PDF nor a text file",
             b"\xff\xd8\xff\xe0 not utf-8": "it is neither a PDF nor a text file",
             pdf(""): "the PDF has no text (a scan, perhaps)",
             b"%PDF-1.4 cut short": "the PDF could not be read",
             b"  \n": "it is empty"}
    for data, why in cases.items():
        alone = files.read(msg(), data, "f")
        assert alone.notice == files.NOT_READ.format(name="notes.txt", why=why), data
        captioned = files.read(msg("what's this?"), data, "f")
        assert captioned.notice is None and captioned.content == f"what's this?\n\n[file notes.txt: not read, {why}]"


def test_the_attachments_after_a_file_are_still_taken_in() -> None:
    """A Slack message with a PDF and then a photo lost the photo: reading the file dropped the rest."""
    photo = {"kind": "photo", "id": "p"}
    read = files.read(msg("compare").model_copy(update={"more_media": [photo]}), b"text", "f")
    assert (read.media, read.more_media) == (None, [photo])
