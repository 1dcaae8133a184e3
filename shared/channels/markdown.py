"""Markdown converted to what each platform renders: Telegram HTML, Slack mrkdwn, WhatsApp's marks,
Feishu's post markdown, plain text.

Code blocks and tables are found with the chunker's rules (shared/channels/text.py); a table goes as a
code block of its cells lined up, as chats draw no tables. On a line of prose,
inline code, [text](url) links (and ![alt](url) images, which go as links), bare URLs and backslash
escapes (a backslash before punctuation stands for that character, as in CommonMark) are set aside
behind placeholders before any emphasis pass runs, so `https://x/pkg/__init__.py` keeps its
underscores, a link target is never rewritten and an escaped mark marks nothing.
"""

from __future__ import annotations

import dataclasses
import html
import itertools
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from shared.channels.text import FENCE, Fence, cells, fence_of, is_fence, tables

Convert = Callable[[str], str]


@dataclass(frozen=True)
class Segment:
    """Prose, or a fenced code block (`fence` is its opener)."""

    text: str
    fence: Fence | None = None

    @property
    def lang(self) -> str:
        words = self.fence.info.split() if self.fence else []
        return re.sub(r"[^\w+#.-]", "", words[0])[:20] if words else ""


# A table's code block: ~~~, so that _code_fence writes ``` unless a row would end that
_TABLE = Fence("~", 3, "", "~~~")


def segments(markdown: str, *, with_tables: bool = True) -> list[Segment]:
    """Prose, code blocks and (`with_tables`) tables, as code blocks of their cells lined up."""
    out: list[Segment] = []
    buf: list[str] = []
    opener: Fence | None = None
    lines = markdown.split("\n")
    found = tables(lines) if with_tables else {}
    i = 0
    while i < len(lines):
        line, end = lines[i], found.get(i)
        if end is not None or (opener is None and is_fence(line)):
            if buf:
                out.append(Segment("\n".join(buf)))
            if end is not None:
                out.append(Segment(_table(lines[i:end]), _TABLE))
            opener, buf = None if end is not None else fence_of(line), []
        elif opener is not None and opener.closed_by(line):
            out.append(Segment("\n".join(buf), opener))
            opener, buf = None, []
        else:
            buf.append(line)
        i = end or i + 1
    if opener is not None or buf:
        out.append(Segment("\n".join(buf), opener))
    return out


def _code_fence(seg: Segment) -> str:
    """``` (all Slack and WhatsApp know) unless a line of the block would end it early; then the
    block's own fence, which no line inside it closes."""
    plain = Fence("`", 3, "", FENCE)
    if seg.fence is None or not any(plain.closed_by(line) for line in seg.text.split("\n")):
        return FENCE
    return seg.fence.marker


# --------------------------------------------------------------------------- spans kept whole

_URL = r"https?://(?:[^\s()<>\"`]|\([^\s()<>\"`]*\))+"  # parentheses only in balanced pairs
_PUNCTUATION = r"[!-/:-@\[-`{-~]"  # ASCII's: what a backslash escapes
_ESCAPE = re.compile(rf"\\({_PUNCTUATION})")
_SPAN = re.compile(rf"(?P<code>`[^`\n]+`)|\\(?P<esc>{_PUNCTUATION})"  # (code first: a backslash there stays)
                   rf"|!?\[(?P<label>[^\]\n]*)\]\((?P<target>{_URL})\)|(?P<url>{_URL})")
_TRAILING = ".,:;!?*_~'"  # ends a sentence or emphasis, not the URL (as GitHub's autolinks)
_PRIVATE_USE = range(0xE000, 0xF900)
# An escaped character waits for the emphasis passes as a code point of its own, in plane 15's private
# use area (a bold pass can tell an escaped `*` from the rest: see _star_bold).
_ESCAPED = 0xF0000
_HIDDEN_ESCAPE = re.compile("[\U000F0021-\U000F007E]")


def _hidden(char: str) -> str:
    return chr(_ESCAPED + ord(char))


@dataclass(frozen=True)
class Spans:
    """How a platform writes inline code, a link, a bare URL and a character a backslash escaped."""

    code: Convert
    link: Callable[[str, str], str]  # (label, url)
    url: Convert
    escaped: Convert  # (ASCII punctuation)


def _inline(line: str, spans: Spans, prose: Convert) -> str:
    """Convert a line of prose: spans go behind placeholders, `prose` runs on the rest, spans come back."""
    mark = next(chr(c) for c in _PRIVATE_USE if chr(c) not in line)  # a character the line lacks
    kept: list[str] = []
    escapes = not _HIDDEN_ESCAPE.search(line)  # (a line that has those code points keeps its backslashes)

    def hide(m: re.Match[str]) -> str:
        tail = ""
        if m["esc"]:
            return _hidden(m["esc"]) if escapes else m[0]
        if m["code"]:
            kept.append(spans.code(m["code"][1:-1]))
        elif m["target"]:  # a link, or an image: chats show no picture for a URL in text
            label = _ESCAPE.sub(lambda e: _hidden(e[1]), m["label"]) if escapes else m["label"]
            kept.append(spans.link(label, m["target"]) if label else spans.url(m["target"]))
        else:
            url = m["url"].rstrip(_TRAILING)
            kept.append(spans.url(url))
            tail = m["url"][len(url) :]
        return f"{mark}{len(kept) - 1}{mark}{tail}"

    converted = re.sub(f"{mark}([0-9]+){mark}", lambda m: kept[int(m[1])], prose(_SPAN.sub(hide, line)))
    return _HIDDEN_ESCAPE.sub(lambda m: spans.escaped(chr(ord(m[0]) - _ESCAPED)), converted) if escapes else converted


def _lines(text: str, convert: Convert, keep: Convert) -> str:
    """Convert line by line; a line that conversion would turn into a fence (`**```**` -> ```` ``` ````)
    keeps its source form instead, so fences stay balanced."""
    out = []
    for line in text.split("\n"):
        new = convert(line)
        out.append(keep(line) if is_fence(new) else new)
    return "\n".join(out)


# --------------------------------------------------------------------------- emphasis

_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+", re.M)
# (underscores open and close emphasis only at a word's edge, as in CommonMark: MY__SETTING__NAME stays whole)
_STRONG_EM = re.compile(r"\*\*\*(?=\S)([^<>\n]+?)(?<=\S)\*\*\*|(?<!\w)___(?=\S)([^<>\n]+?)(?<=\S)___(?!\w)")
_BOLD = re.compile(r"\*\*(?=\S)([^<>\n]+?)(?<=\S)\*\*|(?<!\w)__(?=\S)([^<>\n]+?)(?<=\S)__(?!\w)")


def _italic(bold: str, underscored: str = "(?!)") -> re.Pattern[str]:
    """*italic* (not **bold** nor 2*3*4) and _italic_ (not snake_case), holding whole `bold` spans
    (CommonMark's `*a **b** c*`; `underscored`: the bold an _italic_ span holds that its text cannot)."""
    return re.compile(rf"(?<![\w*])\*(?=[^\s*])((?:[^*<>\n]|{bold})+?)(?<=\S)\*(?![\w*])"
                      rf"|(?<![\w_])_(?=\S)((?:[^_<>\n]|{underscored})+?)(?<=\S)_(?!\w)")


_ITALIC = _italic(r"\*\*(?=\S)[^*<>\n]+?(?<=\S)\*\*")  # before the bold pass: Slack, WhatsApp, plain text
_HTML_BOLD = r"<b>[^<>\n]+?</b>"
_HTML_ITALIC = _italic(_HTML_BOLD, _HTML_BOLD)  # after it: Telegram
_STRIKE = re.compile(r"~~(?=\S)([^~<>\n]+?)(?<=\S)~~")
_TAG = re.compile(r"<(/?)(b|i|s|code|pre|a)\b[^>]*>")


def _either(m: re.Match[str]) -> str:
    return m.group(1) if m.group(1) is not None else m.group(2)


def _escape(text: str) -> str:
    return html.escape(text, quote=False)


# --------------------------------------------------------------------------- tables and quotes


def _table(rows: list[str]) -> str:
    """A table's cells without their markup, lined up: each column as wide as its widest cell, aligned
    as the delimiter row says, a rule under the header (GFM: a short row is filled, a long one cut)."""
    head, delimiter, *body = rows
    aligns = [_align(cell) for cell in cells(delimiter)]
    grid = [([_plain_cell(cell) for cell in cells(row)] + [""] * len(aligns))[: len(aligns)] for row in [head, *body]]
    widths = [max(1, *(_width(row[col]) for row in grid)) for col in range(len(aligns))]
    lines = [" | ".join(map(_pad, row, widths, aligns)) for row in grid]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def _plain_cell(cell: str) -> str:
    return _inline(cell.replace("\\|", "|"), _CELL, _plain_emphasis)


def _align(delimiter: str) -> str:
    if delimiter.endswith(":"):
        return "center" if delimiter.startswith(":") else "right"
    return "left"


def _width(text: str) -> int:
    """The columns a monospace font gives `text`: two for a wide East Asian character, none for a mark."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
               for c in text)


def _pad(cell: str, width: int, align: str) -> str:
    space = width - _width(cell)
    left = {"left": 0, "right": space, "center": space // 2}[align]
    return " " * left + cell + " " * (space - left)


# CommonMark's quote marks: `>` and a space, up to three spaces before (a quote in a quote goes as one
# quote: chats nest none)
_QUOTE = re.compile(r"^ {0,3}(?:>[ \t]?)+")


def _quoted(convert: Convert, mark: str) -> Convert:
    """`convert` for a line that may be quoted: its `>` marks become `mark`, the platform's (which is
    no text to escape), and its content is converted."""
    def line(text: str) -> str:
        quote = _QUOTE.match(text)
        return convert(text) if quote is None else mark + convert(text[quote.end() :])
    return line


# --------------------------------------------------------------------------- Telegram

_TELEGRAM = Spans(code=lambda c: f"<code>{_escape(c)}</code>",
                  link=lambda label, url: f'<a href="{html.escape(url)}">{_escape(label)}</a>', url=_escape,
                  escaped=_escape)


def _html_emphasis(text: str) -> str:
    text = _HEADING.sub(r"<b>\1</b>", _BULLET.sub(r"\1• ", _escape(text)))
    text = _STRONG_EM.sub(lambda m: f"<b><i>{_either(m)}</i></b>", text)
    text = _BOLD.sub(lambda m: f"<b>{_either(m)}</b>", text)
    text = _HTML_ITALIC.sub(lambda m: f"<i>{_either(m)}</i>", text)
    return _STRIKE.sub(r"<s>\1</s>", text)


def _balanced(markup: str) -> bool:
    stack: list[str] = []
    for m in _TAG.finditer(markup):
        if not m.group(1):
            stack.append(m.group(2))
        elif not stack or stack.pop() != m.group(2):
            return False
    return not stack


def _telegram_line(line: str) -> str:
    """A line of prose as HTML; if its emphasis would not nest, that line alone goes without it."""
    rich = _inline(line, _TELEGRAM, _html_emphasis)
    return rich if _balanced(rich) else _inline(line, _TELEGRAM, _escape)


def _telegram_prose(text: str) -> str:
    """Lines of prose as HTML, each run of quoted lines in one blockquote (unless it shows nothing)."""
    out = []
    for quoted, run in itertools.groupby(text.split("\n"), key=lambda line: _QUOTE.match(line) is not None):
        body = "\n".join(_telegram_line(_QUOTE.sub("", line, count=1) if quoted else line) for line in run)
        out.append(f"<blockquote>{body}</blockquote>" if quoted and body.strip() else body)
    return "\n".join(out)


def telegram_html(markdown: str) -> str:
    """Markdown as Telegram's HTML parse mode: escaped, tags always properly nested."""
    out = []
    for seg in segments(markdown):
        if seg.fence is None:
            out.append(_telegram_prose(seg.text))
        else:
            attr = f' class="language-{seg.lang}"' if seg.lang else ""
            out.append(f"<pre><code{attr}>{_escape(seg.text)}</code></pre>")
    return "\n".join(out)


# --------------------------------------------------------------------------- Slack

_SLACK = Spans(code=lambda c: f"`{_escape(c)}`", link=lambda label, url: f"<{_escape(url)}|{_escape(label)}>",
               url=_escape, escaped=_escape)


# Neither mrkdwn nor WhatsApp has an escape for `*` (mrkdwn escapes only &, < and >), and a literal one
# inside bold would end it early: there it shows as this look-alike, U+2217 ASTERISK OPERATOR.
_STAR = "\u2217"
# Slack takes a `*` as bold only at a word's edge (`*bold*text` shows its stars); a zero-width space
# is an edge to Slack and invisible to a reader.
_ZWSP = "\u200b"


def _star_bold(text: str) -> str:
    return f"*{text.replace('*', _STAR).replace(_hidden('*'), _STAR)}*"


def _star_emphasis(text: str, *, glue: str = "") -> str:
    """*bold*, _italic_ (*_both_*) and ~strike~, as Slack and WhatsApp write them (the text escaped
    already); `glue` goes between a bold mark and a letter or digit outside it."""
    text = _ITALIC.sub(lambda m: f"_{_either(m)}_", _BULLET.sub(r"\1• ", text))
    if heading := _HEADING.match(text):  # bold as a whole, so the bold inside goes: neither nests any
        inner = _STRONG_EM.sub(lambda m: f"_{_either(m)}_", heading[1])
        return _star_bold(_STRIKE.sub(r"~\1~", _BOLD.sub(_either, inner)))
    text = _STRONG_EM.sub(lambda m: _glued(m, f"_{_either(m)}_", glue), text)
    text = _BOLD.sub(lambda m: _glued(m, _either(m), glue), text)  # (italic went first: a * left is literal)
    return _STRIKE.sub(r"~\1~", text)


def _glued(m: re.Match[str], inner: str, glue: str) -> str:
    """`inner` as bold, with `glue` on each side where the text around it goes on in a word."""
    before, after = m.string[m.start() - 1 : m.start()], m.string[m.end() : m.end() + 1]
    return (glue if before.isalnum() else "") + _star_bold(inner) + (glue if after.isalnum() else "")


def slack_mrkdwn(markdown: str) -> str:
    """Markdown as Slack mrkdwn: *bold*, _italic_, ~strike~, <url|text>, &, < and > escaped."""
    return "\n".join(
        f"{_code_fence(seg)}\n{_escape(seg.text)}\n{_code_fence(seg)}" if seg.fence
        else _lines(seg.text, _quoted(lambda s: _inline(s, _SLACK, lambda t: _star_emphasis(_escape(t), glue=_ZWSP)),
                                      "> "), _escape)
        for seg in segments(markdown)
    )


# --------------------------------------------------------------------------- plain text

_PLAIN = Spans(code=lambda c: f"`{c}`", link=lambda label, url: f"{label} ({url})", url=lambda url: url,
               escaped=lambda char: char)
_CELL = dataclasses.replace(_PLAIN, code=lambda c: c)  # (a table is all code already)


def _plain_emphasis(text: str) -> str:
    text = _HEADING.sub(r"\1", _BULLET.sub(r"\1• ", text))
    text = _BOLD.sub(_either, text)
    text = _ITALIC.sub(_either, text)
    return _STRIKE.sub(r"\1", text)


def plain_text(markdown: str) -> str:
    """Markdown without its markup (headings, emphasis, links as "text (url)"); code blocks keep
    their fences, which WhatsApp shows as monospace."""
    return "\n".join(
        f"{_code_fence(seg)}\n{seg.text}\n{_code_fence(seg)}" if seg.fence
        else _lines(seg.text, lambda s: _inline(s, _PLAIN, _plain_emphasis), lambda s: s)
        for seg in segments(markdown)
    )


def whatsapp_text(markdown: str) -> str:
    """Markdown as WhatsApp writes it: *bold*, _italic_, ~strike~, ``` blocks, `code` and `> ` quotes as
    they are, links as "text (url)"; nothing to escape (WhatsApp has no markup but these marks)."""
    return "\n".join(
        f"{_code_fence(seg)}\n{seg.text}\n{_code_fence(seg)}" if seg.fence
        else _lines(seg.text, _quoted(lambda s: _inline(s, _PLAIN, _star_emphasis), "> "), lambda s: s)
        for seg in segments(markdown)
    )


# (Feishu reads markdown, backslash escapes with it: they go as written)
_AS_WRITTEN = Spans(code=lambda c: f"`{c}`", link=lambda label, url: f"[{label}]({url})", url=lambda url: url,
                    escaped=lambda char: "\\" + char)


_FEISHU_MENTION = re.compile(r"<(?=\s*at\b)", re.IGNORECASE)  # <at user_id="all"></at>: a mention of everyone


def feishu_md(markdown: str) -> str:
    """Markdown as the `md` element of a Feishu post renders it: as written (emphasis, links, lists,
    code blocks), but headings, which it shows as written, as bold lines, and mention tags, which
    would ping (the whole group, for `all`: text a user or a fetched page had the model repeat), shown
    as text."""
    return "\n".join(
        f"{seg.fence.line.strip()}\n{seg.text}\n{seg.fence.marker}" if seg.fence
        else _lines(_FEISHU_MENTION.sub("<" + _ZWSP, seg.text), lambda s: _inline(s, _AS_WRITTEN, _bold_headings),
                    lambda s: s)
        for seg in segments(markdown, with_tables=False)  # (whether a post's md draws tables is unknown)
    )


def _bold_headings(text: str) -> str:
    if heading := _HEADING.match(text):
        return f"**{_BOLD.sub(_either, heading[1])}**"
    return text


def identity(markdown: str) -> str:
    """For platforms that render markdown themselves (Discord)."""
    return markdown
