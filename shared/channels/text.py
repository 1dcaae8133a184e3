"""Chunking shared by the platform modules: split markdown under a limit at paragraph, line,
sentence boundaries, closing and reopening a code block cut in two (and, once formatted, bold or
struck-through text cut in two; a table cut in two goes on under its header repeated), never inside
inline code, a link or a table's header. Fences follow CommonMark:
``` or ~~~ (three or more), closed only by the same character, at least as long, with no info
string. Lengths are measured in the platform's own unit (`measure`: characters by default; for
Telegram, UTF-16 code units of the text it shows once its HTML is parsed). Conversion to each
platform's markup lives in shared/channels/markdown.py."""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

Formatter = Callable[[str], str]
# A text's length as the platform counts it. split_text needs one that counts each character once or
# twice; format_chunks takes any (its markdown is measured a character at a time).
Measure = Callable[[str], int]

FENCE = "```"
MIN_LIMIT = 16
# A longer run of ` or ~ is not taken as a fence: closing and reopening one must fit in MIN_LIMIT
# with room for content (nobody writes a seven-backtick fence).
MAX_FENCE = 6
_SENTENCE = re.compile("[.!?][\"')\\]]*[ \t]+|[\u3002\uff01\uff1f]")  # ". " and CJK full stops
_SPACE = re.compile(r"\s")
# Inline code, a link (its label taken from the last `[` before it: a scan that stops there stays linear)
_WHOLE = re.compile(r"`[^`\n]+`|!?\[[^\[\]\n]*\]\([^()\s]*(?:\([^()\s]*\)[^()\s]*)*\)")
# Bold and strike: where a span may open and close, as the converters pair them (shared/channels/markdown.py),
# found in a line whose code, URLs and backslash escapes were blanked out (a mark there marks nothing).
_MARKS = {"**": (re.compile(r"(?=\*\*\S)"), re.compile(r"(?<=\S)(?=\*\*)")),
          "__": (re.compile(r"(?<!\w)(?=__\S)"), re.compile(r"(?<=\S)(?=__(?!\w))")),
          "~~": (re.compile(r"(?=~~\S)"), re.compile(r"(?<=\S)(?=~~)"))}
_LITERAL = re.compile(r"`[^`\n]+`|https?://\S+?(?=[.,:;!?*_~']*(?:\s|$))|\\[!-/:-@\[-`{-~]")
# A table (GFM): a row with a pipe, a delimiter row of as many cells (dashes, a colon at an end to align),
# then rows while lines hold a pipe (GFM goes on to a blank line; a model's table ends where its pipes do).
_DELIMITER = re.compile(r"\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?")
_PIPE = re.compile(r"(?<!\\)\|")


@dataclass(frozen=True)
class Fence:
    """A fence line: its character (` or ~), its length, its info string (language) and the line."""

    char: str
    size: int
    info: str
    line: str

    @property
    def marker(self) -> str:
        return self.char * self.size

    def closed_by(self, line: str) -> bool:
        """The same character, at least as long, nothing after it but spaces."""
        other = fence_of(line)
        return other is not None and other.char == self.char and other.size >= self.size and not other.info


def fence_of(line: str) -> Fence | None:
    """The fence `line` is, or None (a backtick fence's info string holds no backtick)."""
    stripped = line.strip()
    char = stripped[:1]
    if char not in ("`", "~"):
        return None
    size = len(stripped) - len(stripped.lstrip(char))
    info = stripped[size:].strip()
    if not 3 <= size <= MAX_FENCE or (char == "`" and "`" in info):
        return None
    return Fence(char, size, info, stripped)


def is_fence(line: str) -> bool:
    """A line that opens or closes a code block."""
    return fence_of(line) is not None


def cells(row: str) -> list[str]:
    """A table row's cells, stripped (pipes at its ends are optional; `\\|` is a pipe inside a cell)."""
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return [cell.strip() for cell in _PIPE.split(row)]


def _table_head(header: str, delimiter: str) -> bool:
    return ("|" in header and "|" in delimiter and not is_fence(header)
            and _DELIMITER.fullmatch(delimiter.strip()) is not None and len(cells(header)) == len(cells(delimiter)))


def _is_row(line: str) -> bool:
    return "|" in line and not is_fence(line)


def tables(lines: list[str]) -> dict[int, int]:
    """The tables outside code blocks: the index of the line each starts at -> that of the line after it."""
    found: dict[int, int] = {}
    opener, end = None, 0
    for i, line in enumerate(lines):
        if opener is None and i >= end and i + 1 < len(lines) and _table_head(line, lines[i + 1]):
            end = i + 2
            while end < len(lines) and _is_row(lines[end]):
                end += 1
            found[i] = end
        opener = step(opener, line)
    return found


def step(opener: Fence | None, line: str) -> Fence | None:
    """The block open after `line`, given the one open before it."""
    if opener is None:
        return fence_of(line)
    return None if opener.closed_by(line) else opener


def open_fence(text: str, opener: Fence | None = None) -> Fence | None:
    """The opener of the code block still open at the end of `text`, or None."""
    for line in text.split("\n"):
        opener = step(opener, line)
    return opener


@dataclass(frozen=True)
class Piece:
    """One chunk: a slice of the original text, plus fence lines added around a cut code block."""

    body: str
    reopen: str = ""  # the fence opener repeated because the previous piece was cut inside a block
    close: str = ""  # a fence closer added because this piece was cut inside one

    def __str__(self) -> str:
        return self.reopen + self.body + self.close


def split_text(text: str, limit: int, *, measure: Measure = len) -> list[Piece]:
    """Pieces of at most `limit` (as `measure` counts) whose bodies rejoin to `text`, fences balanced in each."""
    _check(limit)
    pieces: list[Piece] = []
    pos, opener = 0, None
    while pos < len(text):
        piece, opener = _next_piece(text[pos:], opener, limit, measure)
        pieces.append(piece)
        pos += len(piece.body)
    return pieces


def _check(limit: int) -> None:
    if limit < MIN_LIMIT:
        raise ValueError(f"limit must be at least {MIN_LIMIT}")


def _next_piece(rest: str, opener: Fence | None, limit: int, measure: Measure) -> tuple[Piece, Fence | None]:
    """The piece `rest` starts with (inside the block `opener` opened, if any), and the block open after it."""
    reopen = _reopen(opener, limit, measure)
    room = limit - measure(reopen)
    closing = _closing_room(opener, rest[:room])  # fences are ASCII: one unit a character
    size = measure(rest[: room + 1])  # measure counts a character at least once: enough to compare
    fits = size <= room - closing or (size <= room and open_fence(reopen + rest) is None)
    body = rest if fits else rest[: _cut(rest, _prefix(rest, room - closing, measure), opener)]
    after = open_fence(reopen + body)
    close = ("" if body.endswith("\n") else "\n") + after.marker if after is not None else ""
    return Piece(body, reopen, close), after


def _prefix(text: str, units: int, measure: Measure) -> int:
    """The length of the longest start of `text` that measures at most `units`."""
    low, high = 0, min(len(text), units)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if measure(text[:mid]) <= units else (low, mid - 1)
    return low


def _reopen(opener: Fence | None, limit: int, measure: Measure) -> str:
    if opener is None:
        return ""
    return opener.line + "\n" if measure(opener.line) < limit // 4 else opener.marker + "\n"


def _closing_room(opener: Fence | None, window: str) -> int:
    """The most a closer added at a cut in `window` can take: a newline and the longest fence that
    can be open there (the one open now, or one a line of the window opens)."""
    sizes = [len(FENCE), opener.size if opener else 0]
    for line in window.split("\n"):
        stripped = line.lstrip()
        if stripped[:1] in ("`", "~"):
            sizes.append(min(MAX_FENCE, len(stripped) - len(stripped.lstrip(stripped[0]))))
    return 1 + max(sizes)


def _cut(text: str, end: int, opener: Fence | None) -> int:
    """Where to end a piece within text[:end]: paragraph, then line, sentence, word, hard. A cut in
    the first quarter only keeps what follows it whole: not when that is a word longer than a whole
    piece, which has to be cut anyway, so it fills this piece instead."""
    window = text[:end]
    para = line = offset = 0
    for raw in window.split("\n")[:-1]:
        offset += len(raw) + 1
        opener = step(opener, raw)
        if opener is None and _parts_table_head(text, offset):
            continue
        line = offset
        if opener is None and (not raw.strip() or is_fence(raw)):
            para = offset
    sentence = max((m.end() for m in _SENTENCE.finditer(window)), default=0)
    word = window.rfind(" ") + 1
    for floor in (len(window) // 4,) if _word_outgrows(text, end) else (len(window) // 4, 0):
        for cut in (para, line):
            if cut > floor:
                return cut
        for cut in (sentence, word):
            if cut > floor:
                return _before_fence_line(window, _outside_spans(text, cut))
    return _before_fence_line(window, len(window))


def _parts_table_head(text: str, at: int) -> bool:
    """Whether a cut at `at` (a line's start) parts a table's header from its delimiter row, or those
    two from its first row (rows that go without them are no table)."""
    above, below = text.rfind("\n", 0, at - 1) + 1, text.find("\n", at)  # the lines around the cut
    prev, after = text[above : at - 1], text[at : below if below >= 0 else len(text)]
    if _table_head(prev, after):
        return True
    top = text.rfind("\n", 0, max(above - 1, 0)) + 1
    return above > 0 and _is_row(after) and _table_head(text[top : above - 1], prev)


def _word_outgrows(text: str, end: int) -> bool:
    """Whether the word that runs on across `end` is longer than `end`: no piece would hold it whole."""
    tail = len(_SPACE.split(text[:end])[-1])
    space = _SPACE.search(text, end)
    return tail + (space.start() if space else len(text)) - end > end


def _outside_spans(text: str, cut: int) -> int:
    """Never cut inside inline code or a link (a label holds spaces): move the cut to where it starts,
    when there is room before it."""
    start = text.rfind("\n", 0, cut) + 1
    end = text.find("\n", cut)
    for m in _WHOLE.finditer(text, start, end if end >= 0 else len(text)):
        if m.start() < cut < m.end():
            return m.start() if m.start() > 0 else cut
    return cut


def _before_fence_line(window: str, cut: int) -> int:
    """Never cut inside a fence line: move the cut to the start of that line when there is room."""
    start = window.rfind("\n", 0, cut) + 1
    end = window.find("\n", start)
    line = window[start : end if end >= 0 else len(window)]
    return start if 0 < start < cut and is_fence(line) else cut


def format_chunks(text: str, limit: int, fmt: Formatter, *, measure: Measure = len) -> list[str]:
    """`text` split and formatted into chunks that `measure` (which counts formatted text, as the
    platform does) finds under `limit`. The markdown is cut counting each character as the platform
    counts it alone; a piece whose formatting outgrows the limit is cut again, shorter by as much as
    it outgrew, and the text after it goes on in the next piece (no tiny piece between). Bold or
    struck-through text cut in two is closed at the cut and reopened after it; a table's rows go on
    under its header (when that takes an eighth of the limit at most). Pieces with nothing visible are
    dropped. Formatting stays valid for limits of 200 and more (every platform's is at least 2000)."""
    _check(limit)
    units = _per_character(measure)
    inside, heads = _emphasis(text), _table_heads(text, limit // 8, units)
    out: list[str] = []
    pos, opener = 0, None
    while pos < len(text):
        piece, opener, chunks = _fitted(text[pos:], opener, limit=limit, fmt=fmt, measure=measure, units=units,
                                        dress=functools.partial(_dressed, inside, heads(pos), pos))
        out += chunks
        pos += len(piece.body)
    return out


Inside = Callable[[int], str]  # the marks of the bold or strike spans whose text goes on across a position


def _emphasis(text: str) -> Inside:
    """Where `text` is inside bold or struck-through spans of a line of prose (not in a code block)."""
    spans: list[tuple[int, int, str]] = []
    offset, opener = 0, None
    for line in text.split("\n"):
        if opener is None and not is_fence(line):
            blank = _LITERAL.sub(lambda m: "x" * len(m[0]), line)
            spans += [(offset + start, offset + end, mark) for mark in _MARKS for start, end in _spans(blank, mark)]
        opener = step(opener, line)
        offset += len(line) + 1
    spans.sort()
    return lambda pos: "".join(mark for start, end, mark in spans if start < pos < end)


def _spans(line: str, mark: str) -> Iterator[tuple[int, int]]:
    """Where the text of each `mark` span of `line` starts and ends: an opener takes the first closer
    after it, as the converters' lazy patterns do (found in linear time: a line can be long)."""
    opens, closes = _MARKS[mark]
    ends = [m.start() for m in closes.finditer(line)]
    pos = 0
    for start in (m.start() for m in opens.finditer(line)):
        if start < pos:  # inside the span found last
            continue
        i = bisect.bisect_left(ends, start + 2)
        if i == len(ends):  # no closer after this opener: none after a later one either
            return
        yield start + 2, ends[i]
        pos = ends[i] + 2


def _table_heads(text: str, most: int, units: Measure) -> Callable[[int], str]:
    """The header and delimiter rows of the table whose rows a piece at a position goes on with, if
    they take `most` units at most ("" if none, or if the piece starts inside a row: the rest of a row
    cut in two, under a header, would show as cells it is not)."""
    lines = text.split("\n")
    starts = list(itertools.accumulate((len(line) + 1 for line in lines), initial=0))
    heads = [(starts[i + 2], starts[end] - 1, f"{lines[i]}\n{lines[i + 1]}\n") for i, end in tables(lines).items()]
    heads = [(start, end, head) for start, end, head in heads if units(head) <= most]
    return lambda pos: next((head for start, end, head in heads if start <= pos < end and text[pos - 1] == "\n"), "")


def _dressed(inside: Inside, head: str, pos: int, piece: Piece) -> str:
    """The markdown of the piece at `pos`: under `head` (a table's, if it starts in the table's rows),
    spans cut at its start reopened, those cut at its end closed (innermost first) before the spaces it
    ends with (a mark after a space closes nothing)."""
    if not piece.body.strip():
        return str(piece)
    text = head + inside(pos) + str(piece)
    close = inside(pos + len(piece.body))[::-1]  # (each mark is two of one character)
    bare = text.rstrip()
    return bare + close + text[len(bare):] if close else text


def _per_character(measure: Measure) -> Measure:
    """`measure` taken a character at a time: markup in the text counts as the characters it is
    (Telegram's measure reads `<b>` as a tag, the markdown `<b>` is text)."""
    cost = functools.cache(measure)
    return lambda text: sum(map(cost, text))


def _fitted(rest: str, opener: Fence | None, *, limit: int, fmt: Formatter, measure: Measure, units: Measure,
            dress: Callable[[Piece], str]) -> tuple[Piece, Fence | None, list[str]]:
    """The next piece, the block open after it and its formatted chunks (none if nothing shows)."""
    room = limit
    while True:
        piece, after = _next_piece(rest, opener, room, units)
        markdown = dress(piece)
        formatted = fmt(markdown) if _visible(markdown) else ""
        size = measure(formatted)
        if size <= limit:
            return piece, after, [formatted] if formatted.strip() else []
        # Shorter by as much as it outgrew (a table's head, which `room` leaves out, may be what did), and
        # shorter than this piece: the loop ends, in a few passes
        room = min(room - max(1, (size - limit) * units(markdown) // size), units(markdown) * limit // size)
        if room < MIN_LIMIT:  # unreachable for real limits; keeps the guarantee anyway
            return piece, after, _hard_split(formatted, limit, measure)


def _hard_split(text: str, limit: int, measure: Measure) -> list[str]:
    out = []
    while text:
        cut = _prefix(text, limit, measure)
        out.append(text[:cut])
        text = text[cut:]
    return out


def _visible(markdown: str) -> bool:
    return any(line.strip() and not is_fence(line) for line in markdown.split("\n"))
