"""Files sent in a chat: the worker that submits one (a PDF, or a text file: notes, Markdown, CSV, JSON,
code) fetches it, and its text goes to the model with the message, after the caption, as
`[file NAME]` and the text, cut to MAX_CHARS. It stays in the conversation as part of the message
(the window and the token guard bound what later prompts carry). A file with no text a model could
read (a scan, a spreadsheet, a protected PDF) gets its sender a notice that says so and costs no LLM
call; with a caption, the caption is answered, the model told the file was not read and why. Where
files are kept in the workspace (shared.channels.saved), the model is told where, and a file it could
not read goes to it all the same: its tools may open it."""

from __future__ import annotations

import io
import logging

from pypdf import PdfReader
from pypdf.errors import PyPdfError

from shared.contracts import InboundMessage

log = logging.getLogger(__name__)
MAX_FILE = 10 * 1024 * 1024  # bytes fetched at most
MAX_CHARS = 20_000  # characters of a file's text the model is given (about 5,000 tokens)
MAX_PAGES = 100  # pages of a PDF read at most (fewer once MAX_CHARS are read)
CUT = "\n[... not shown: {left}]"
NOT_READ = "Sorry, I couldn't read {name}: {why}. Could you send its text?"


def worth_fetching(mime: object) -> bool:
    """Whether a file of this type (as the platform says) may have text to read: not a picture, sound or
    film (photos and voice messages have their own way in)."""
    return not (isinstance(mime, str) and mime.startswith(("image/", "audio/", "video/")))


def named(msg: InboundMessage, fetched_as: str) -> str:
    """The file's name as its sender named it, where the platform says, on one line."""
    return " ".join(((msg.media or {}).get("name") or fetched_as).split())[:200]


def read(msg: InboundMessage, data: bytes, fetched_as: str, kept: str | None = None) -> InboundMessage:
    """`msg` with the text of its file (fetched by shared.channels.media) after its caption, and
    where the file was kept in the workspace (`kept`) if it was. A file with no text to read gets its
    sender a notice that says why, unless it was kept (the agent may open it with its tools) or has
    a caption: then the message goes on, saying so to the model."""
    name = named(msg, fetched_as)
    text, why, unread = _pdf(data) if data.startswith(b"%PDF-") else (*_plain(data), 0)
    log.info("inbound event %s: file %r, %d bytes: %s%s", msg.event_id, name, len(data),
             f"{len(text)} characters of text" if text else why, f"; kept as {kept}" if kept else "")
    where = f"; saved as {kept}" if kept else ""
    if not text:
        if not msg.content.strip() and not kept:
            return msg.answered(NOT_READ.format(name=name, why=why))
        block = f"[file {name}: not read, {why}{where}]"
    else:
        left = [*([f"{len(text) - MAX_CHARS:,} more characters"] if len(text) > MAX_CHARS else []),
                *([f"{unread} more page(s)"] if unread else [])]
        block = f"[file {name}{where}]\n{text[:MAX_CHARS]}{CUT.format(left=' and '.join(left)) if left else ''}"
    content = f"{msg.content}\n\n{block}" if msg.content.strip() else block
    return msg.model_copy(update={"content": content, "media": None, "unsupported": None})


def _plain(data: bytes) -> tuple[str, str]:
    """The text of a file that is UTF-8 (or UTF-16 with its byte-order mark), and why there is none."""
    try:
        text = data.decode("utf-16") if data[:2] in (b"\xff\xfe", b"\xfe\xff") else data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return "", "it is neither a PDF nor a text file"
    if "\x00" in text:  # (a binary file can be valid UTF-8)
        return "", "it is neither a PDF nor a text file"
    return text.strip(), "it is empty"


def _pdf(data: bytes) -> tuple[str, str, int]:
    """The text of a PDF's pages, up to MAX_PAGES of them or until MAX_CHARS are read (about 4 ms of
    CPU a page); why there is none; and how many pages were left unread."""
    pages: list[str] = []
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            return "", "the PDF is protected by a password", 0
        total, size = len(reader.pages), 0
        for page in reader.pages:
            if len(pages) == MAX_PAGES or size > MAX_CHARS:
                break
            pages.append((page.extract_text() or "").strip())
            size += len(pages[-1])
    except (PyPdfError, ValueError, KeyError, TypeError, RecursionError) as err:  # a damaged file
        log.warning("a PDF could not be read: %s: %s", type(err).__name__, err)
        return "", "the PDF could not be read", 0
    return "\n\n".join(p for p in pages if p), "the PDF has no text (a scan, perhaps)", total - len(pages)
