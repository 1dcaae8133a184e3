"""Chunking shared by the platform modules: split markdown under a limit at paragraph, line,
sentence boundaries, closing and reopening a code block cut in two. Fences follow CommonMark:
``` or ~~~ (three or more), closed only by the same character, at least as long, with no info
string. Lengths are measured in the platform's own unit (`measure`: characters by default, UTF-16
code units for Telegram). Conversion to each platform's markup lives in shared/channels/markdown.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

Formatter = Callable[[str], str]
Measure = Callable[[str], int]  # a text's length as the platform counts it: at least 1, at most 2 per character

FENCE = "```"
MIN_LIMIT = 16
# A longer run of ` or ~ is not taken as a fence: closing and reopening one must fit in MIN_LIMIT
# with room for content (nobody writes a seven-backtick fence).
MAX_FENCE = 6
_SENTENCE = re.compile("[.!?][\"')\\]]*[ \t]+|[\u3002\uff01\uff1f]")  # ". " and CJK full stops


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
    if limit < MIN_LIMIT:
        raise ValueError(f"limit must be at least {MIN_LIMIT}")
    pieces: list[Piece] = []
    pos, opener = 0, None
    while pos < len(text):
        reopen = _reopen(opener, limit, measure)
        rest = text[pos:]
        room = limit - measure(reopen)
        closing = _closing_room(opener, rest[:room])  # fences are ASCII: one unit a character
        size = measure(rest[: room + 1])  # measure counts a character at least once: enough to compare
        fits = size <= room - closing or (size <= room and open_fence(reopen + rest) is None)
        body = rest if fits else rest[: _cut(rest[: _prefix(rest, room - closing, measure)], opener)]
        opener = open_fence(reopen + body)
        close = ("" if body.endswith("\n") else "\n") + opener.marker if opener is not None else ""
        pieces.append(Piece(body, reopen, close))
        pos += len(body)
    return pieces


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


def _cut(window: str, opener: Fence | None) -> int:
    """Where to end a piece within `window`: paragraph, then line, sentence, word, hard."""
    para = line = offset = 0
    for raw in window.split("\n")[:-1]:
        offset += len(raw) + 1
        opener = step(opener, raw)
        line = offset
        if opener is None and (not raw.strip() or is_fence(raw)):
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


def format_chunks(text: str, limit: int, fmt: Formatter, *, measure: Measure = len) -> list[str]:
    """`text` split under `limit` (as `measure` counts) and formatted; a piece whose formatting
    outgrows the limit is split again, smaller. Pieces with nothing visible are dropped. Formatting
    stays valid for limits of 200 and more (every platform's is at least 2000)."""
    out: list[str] = []
    for piece in split_text(text, limit, measure=measure):
        out += _fit(str(piece), limit=limit, split_at=limit, fmt=fmt, measure=measure)
    return out


def _fit(markdown: str, *, limit: int, split_at: int, fmt: Formatter, measure: Measure) -> list[str]:
    if not _visible(markdown):
        return []
    formatted = fmt(markdown)
    if measure(formatted) <= limit:
        return [formatted] if formatted.strip() else []
    smaller = split_at // 2
    if smaller < MIN_LIMIT:  # unreachable for real limits; keeps the guarantee anyway
        return _hard_split(formatted, limit, measure)
    return [c for p in split_text(markdown, smaller, measure=measure)
            for c in _fit(str(p), limit=limit, split_at=smaller, fmt=fmt, measure=measure)]


def _hard_split(text: str, limit: int, measure: Measure) -> list[str]:
    out = []
    while text:
        cut = _prefix(text, limit, measure)
        out.append(text[:cut])
        text = text[cut:]
    return out


def _visible(markdown: str) -> bool:
    return any(line.strip() and not is_fence(line) for line in markdown.split("\n"))
