"""Formatting and chunking shared by the platform modules: split markdown under a limit at
paragraph, line, sentence boundaries (closing and reopening a code fence cut in two), and convert
markdown to Telegram HTML, Slack mrkdwn or plain text."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass

Formatter = Callable[[str], str]

FENCE = "```"
CLOSE_LEN = len("\n" + FENCE)  # the most a fence closer added at a cut takes
MIN_LIMIT = 16
_SENTENCE = re.compile("[.!?][\"')\\]]*[ \t]+|[\u3002\uff01\uff1f]")  # ". " and CJK full stops


def is_fence(line: str) -> bool:
    """A line that opens or closes a code block."""
    return line.lstrip().startswith(FENCE)


def open_fence(text: str) -> str | None:
    """The opening line of the code block still open at the end of `text`, or None."""
    opener: str | None = None
    for line in text.split("\n"):
        if is_fence(line):
            opener = None if opener is not None else line.strip()
    return opener


@dataclass(frozen=True)
class Piece:
    """One chunk: a slice of the original text, plus fence lines added around a cut code block."""

    body: str
    reopen: str = ""  # the fence opener repeated because the previous piece was cut inside a block
    close: str = ""  # a fence closer added because this piece was cut inside one

    def __str__(self) -> str:
        return self.reopen + self.body + self.close


def split_text(text: str, limit: int) -> list[Piece]:
    """Pieces of at most `limit` characters whose bodies rejoin to `text`, fences balanced in each."""
    if limit < MIN_LIMIT:
        raise ValueError(f"limit must be at least {MIN_LIMIT}")
    pieces: list[Piece] = []
    pos, opener = 0, None
    while pos < len(text):
        reopen = _reopen(opener, limit)
        rest = text[pos:]
        room = limit - len(reopen)
        fits = len(rest) <= room - CLOSE_LEN or (len(rest) <= room and open_fence(reopen + rest) is None)
        body = rest if fits else rest[: _cut(rest[: room - CLOSE_LEN], inside=opener is not None)]
        opener = open_fence(reopen + body)
        close = ("" if body.endswith("\n") else "\n") + FENCE if opener is not None else ""
        pieces.append(Piece(body, reopen, close))
        pos += len(body)
    return pieces


def _reopen(opener: str | None, limit: int) -> str:
    if opener is None:
        return ""
    return opener + "\n" if len(opener) < limit // 4 else FENCE + "\n"


def _cut(window: str, *, inside: bool) -> int:
    """Where to end a piece within `window`: paragraph, then line, sentence, word, hard."""
    para = line = 0
    outside = not inside
    offset = 0
    for raw in window.split("\n")[:-1]:
        offset += len(raw) + 1
        if is_fence(raw):
            outside = not outside
        line = offset
        if outside and (not raw.strip() or is_fence(raw)):
            para = offset
    sentence = max((m.end() for m in _SENTENCE.finditer(window)), default=0)
    word = window.rfind(" ") + 1
    for floor in (len(window) // 4, 0):
        for cut in (para, line):
            if cut > floor:
                return cut
        for cut in (sentence, word):
            if cut > floor:
                return _before_fence_line(window, cut)
    return _before_fence_line(window, len(window))


def _before_fence_line(window: str, cut: int) -> int:
    """Never cut inside a fence line: move the cut to the start of that line when there is room."""
    start = window.rfind("\n", 0, cut) + 1
    end = window.find("\n", start)
    line = window[start : end if end >= 0 else len(window)]
    return start if 0 < start < cut and is_fence(line) else cut


def format_chunks(text: str, limit: int, fmt: Formatter) -> list[str]:
    """`text` split under `limit` and formatted; a piece whose formatting outgrows the limit is
    split again, smaller. Pieces with nothing visible are dropped. Formatting stays valid for limits
    of 200 and more (every platform's is at least 2000)."""
    out: list[str] = []
    for piece in split_text(text, limit):
        out += _fit(str(piece), limit, limit, fmt)
    return out


def _fit(markdown: str, limit: int, split_at: int, fmt: Formatter) -> list[str]:
    if not _visible(markdown):
        return []
    formatted = fmt(markdown)
    if len(formatted) <= limit:
        return [formatted] if formatted.strip() else []
    smaller = split_at // 2
    if smaller < MIN_LIMIT:  # unreachable for real limits; keeps the guarantee anyway
        return [formatted[i : i + limit] for i in range(0, len(formatted), limit)]
    return [c for p in split_text(markdown, smaller) for c in _fit(str(p), limit, smaller, fmt)]


def _visible(markdown: str) -> bool:
    return any(line.strip() and not is_fence(line) for line in markdown.split("\n"))


# --------------------------------------------------------------------------- markdown conversion


@dataclass(frozen=True)
class Segment:
    """Prose, or a fenced code block (`lang` from its opener)."""

    text: str
    code: bool = False
    lang: str = ""


def segments(markdown: str) -> list[Segment]:
    out: list[Segment] = []
    buf: list[str] = []
    lang: str | None = None
    for line in markdown.split("\n"):
        if not is_fence(line):
            buf.append(line)
            continue
        if lang is None:
            if buf:
                out.append(Segment("\n".join(buf)))
            lang = re.sub(r"[^\w+#.-]", "", line.strip()[3:])[:20]
        else:
            out.append(Segment("\n".join(buf), code=True, lang=lang))
            lang = None
        buf = []
    if lang is not None:
        out.append(Segment("\n".join(buf), code=True, lang=lang))
    elif buf:
        out.append(Segment("\n".join(buf)))
    return out


_INLINE_CODE = re.compile(r"(`[^`\n]+`)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+", re.M)
_BOLD = re.compile(r"\*\*(?=\S)([^<>\n]+?)(?<=\S)\*\*|__(?=\S)([^<>\n]+?)(?<=\S)__")
_ITALIC = re.compile(
    r"(?<![\w*])\*(?=[^\s*])([^*<>\n]+?)(?<=\S)\*(?![\w*])"  # *italic*, not **bold** nor 2*3*4
    r"|(?<![\w_])_(?=\S)([^_<>\n]+?)(?<=\S)_(?!\w)"  # _italic_, not snake_case
)
_STRIKE = re.compile(r"~~(?=\S)([^~<>\n]+?)(?<=\S)~~")
_LINK = re.compile(r"\[([^\]\n]+)\]\((https?://[^)\s\"]+)\)")
_TAG = re.compile(r"<(/?)(b|i|s|code|pre|a)\b[^>]*>")


def _either(m: re.Match[str]) -> str:
    return m.group(1) if m.group(1) is not None else m.group(2)


def _prose(text: str, code: Callable[[str], str], rest: Callable[[str], str]) -> str:
    """Apply `rest` to everything but inline code spans, which get `code`."""
    parts = _INLINE_CODE.split(text)
    return "".join(code(p[1:-1]) if i % 2 else rest(p) for i, p in enumerate(parts))


def _no_new_fences(text: str, convert: Callable[[str], str], keep: Callable[[str], str]) -> str:
    """Convert line by line; a line that conversion would turn into a fence (`**```**` -> ```` ``` ````)
    keeps its source form instead, so fences stay balanced."""
    out = []
    for line in text.split("\n"):
        new = convert(line)
        out.append(keep(line) if is_fence(new) else new)
    return "\n".join(out)


def _escape(text: str) -> str:
    return html.escape(text, quote=False)


def _html_inline(text: str) -> str:
    text = _HEADING.sub(r"<b>\1</b>", _BULLET.sub(r"\1• ", _escape(text)))
    text = _BOLD.sub(lambda m: f"<b>{_either(m)}</b>", text)
    text = _ITALIC.sub(lambda m: f"<i>{_either(m)}</i>", text)
    text = _STRIKE.sub(r"<s>\1</s>", text)
    return _LINK.sub(r'<a href="\2">\1</a>', text)


def _balanced(markup: str) -> bool:
    stack: list[str] = []
    for m in _TAG.finditer(markup):
        if not m.group(1):
            stack.append(m.group(2))
        elif not stack or stack.pop() != m.group(2):
            return False
    return not stack


def telegram_html(markdown: str) -> str:
    """Markdown as Telegram's HTML parse mode: escaped, tags always properly nested."""

    def block(seg: Segment, inline: Callable[[str], str]) -> str:
        if not seg.code:
            return _prose(seg.text, lambda c: f"<code>{_escape(c)}</code>", inline)
        attr = f' class="language-{seg.lang}"' if seg.lang else ""
        return f"<pre><code{attr}>{_escape(seg.text)}</code></pre>"

    parts = segments(markdown)
    rich = "\n".join(block(seg, _html_inline) for seg in parts)
    return rich if _balanced(rich) else "\n".join(block(seg, _escape) for seg in parts)


def _slack_inline(text: str) -> str:
    text = _BULLET.sub(r"\1• ", _escape(text))
    text = _ITALIC.sub(lambda m: f"_{_either(m)}_", text)
    text = _BOLD.sub(lambda m: f"*{_either(m)}*", text)
    text = _HEADING.sub(r"*\1*", text)
    text = _STRIKE.sub(r"~\1~", text)
    return _LINK.sub(r"<\2|\1>", text)


def slack_mrkdwn(markdown: str) -> str:
    """Markdown as Slack mrkdwn: *bold*, _italic_, ~strike~, <url|text>, &, < and > escaped."""
    return "\n".join(
        f"{FENCE}\n{_escape(seg.text)}\n{FENCE}" if seg.code
        else _no_new_fences(seg.text, lambda s: _prose(s, lambda c: f"`{_escape(c)}`", _slack_inline), _escape)
        for seg in segments(markdown)
    )


def _plain_inline(text: str) -> str:
    text = _HEADING.sub(r"\1", _BULLET.sub(r"\1• ", text))
    text = _BOLD.sub(_either, text)
    text = _ITALIC.sub(_either, text)
    text = _STRIKE.sub(r"\1", text)
    return _LINK.sub(r"\1 (\2)", text)


def plain_text(markdown: str) -> str:
    """Markdown without its markup (headings, emphasis, links as "text (url)"); code blocks keep
    their fences, which WhatsApp shows as monospace."""
    return "\n".join(
        f"{FENCE}\n{seg.text}\n{FENCE}" if seg.code
        else _no_new_fences(seg.text, lambda s: _prose(s, lambda c: f"`{c}`", _plain_inline), lambda s: s)
        for seg in segments(markdown)
    )


def identity(markdown: str) -> str:
    """For platforms that render markdown themselves (Discord)."""
    return markdown
