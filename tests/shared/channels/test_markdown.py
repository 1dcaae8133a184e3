"""Markdown as LLMs write it, converted without stray marks: bold italic, images, bold inside a word,
tables and quotes."""

from __future__ import annotations

import html
import unicodedata
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.channels.markdown import feishu_md, plain_text, slack_mrkdwn, telegram_html, whatsapp_text
from tests.fakes.telegram import parse_entities

ZWSP = "\u200b"


@pytest.mark.parametrize("md", ["***both*** words", "___both___ words"])
def test_bold_italic_is_bold_and_italic(md: str) -> None:
    assert telegram_html(md) == "<b><i>both</i></b> words"
    assert slack_mrkdwn(md) == "*_both_* words"
    assert whatsapp_text(md) == "*_both_* words"
    assert plain_text(md) == "both words"


def test_bold_italic_next_to_bold_and_in_a_heading() -> None:
    assert telegram_html("***a*** and **b** and *c*") == "<b><i>a</i></b> and <b>b</b> and <i>c</i>"
    assert slack_mrkdwn("# The ***main*** point") == "*The _main_ point*"  # Slack nests no bold


def test_an_image_is_a_link_without_its_bang() -> None:
    md = "see ![diagram](https://e.com/i.png)!"
    assert telegram_html(md) == 'see <a href="https://e.com/i.png">diagram</a>!'
    assert slack_mrkdwn(md) == "see <https://e.com/i.png|diagram>!"
    assert whatsapp_text(md) == plain_text(md) == "see diagram (https://e.com/i.png)!"
    assert telegram_html("![](https://e.com/i.png)") == "https://e.com/i.png"  # no alt text: the URL itself
    assert slack_mrkdwn("[](https://e.com)") == "https://e.com"


def test_slack_bold_inside_a_word_is_set_apart_by_a_zero_width_space() -> None:
    """mrkdwn takes `*` as bold only at a word's edge: `*bold*text` shows its asterisks. A zero-width
    space is an edge Slack sees and a reader does not."""
    assert slack_mrkdwn("**bold**text**more**") == f"*bold*{ZWSP}text{ZWSP}*more*"
    assert slack_mrkdwn("un**believ**able, **ok**.") == f"un{ZWSP}*believ*{ZWSP}able, *ok*."
    assert ZWSP not in slack_mrkdwn("**bold** text (**more**)")


@pytest.mark.parametrize("convert", [telegram_html, slack_mrkdwn, whatsapp_text, plain_text])
def test_double_underscores_inside_a_word_stay(convert: Callable[[str], str]) -> None:
    """NANOFLEET_TOOLS__EXEC__RUN_AS_USER came out as NANOFLEET_TOOLS<b>EXEC</b>RUN_AS_USER (nanofleet's own
    error message telling the user which setting to change, too): underscores inside a word are no
    emphasis in CommonMark."""
    for text in ("set NANOFLEET_TOOLS__EXEC__RUN_AS_USER now", "my__var__name and ___x___y"):
        assert convert(text) == text, convert
    assert "bold" in convert("__bold__") and "__" not in convert("__bold__")  # at a word's edge: still bold


# --------------------------------------------------------------------------- backslash escapes

QA_REPLY = r"Use \*args and \*\*kwargs; *note: **always** check*"


def test_escaped_marks_are_literal_and_bold_nests_in_italics() -> None:
    """The reply reached WhatsApp as `Use \\_args and \\_\\*kwargs; *note: *always* check*`: escaped stars
    paired as emphasis, backslashes shown, the bold inside the italics broken."""
    assert whatsapp_text(QA_REPLY) == "Use *args and **kwargs; _note: *always* check_"
    assert slack_mrkdwn(QA_REPLY) == "Use *args and **kwargs; _note: *always* check_"
    assert telegram_html(QA_REPLY) == "Use *args and **kwargs; <i>note: <b>always</b> check</i>"
    assert plain_text(QA_REPLY) == "Use *args and **kwargs; note: always check"
    assert feishu_md(QA_REPLY) == QA_REPLY  # Feishu reads the markdown, escapes with it


def test_an_escaped_character_is_written_as_the_format_needs() -> None:
    md = r"\# not a heading, \<b\> \& 5\* \_x\_"
    assert telegram_html(md) == "# not a heading, &lt;b&gt; &amp; 5* _x_"
    assert slack_mrkdwn(md) == "# not a heading, &lt;b&gt; &amp; 5* _x_"
    assert whatsapp_text(md) == plain_text(md) == "# not a heading, <b> & 5* _x_"
    assert feishu_md(md) == md
    assert [f(r"\- not a bullet") for f in (telegram_html, whatsapp_text)] == ["- not a bullet"] * 2
    assert telegram_html(r"\\*it*") == "\\<i>it</i>"  # an escaped backslash: the star after it still marks


def test_an_escaped_star_in_bold_is_the_look_alike_where_a_star_would_end_it() -> None:
    assert slack_mrkdwn(r"**2 \* 3 = 6**") == whatsapp_text(r"**2 \* 3 = 6**") == "*2 \u2217 3 = 6*"
    assert slack_mrkdwn(r"# Rated 5\* overall") == "*Rated 5\u2217 overall*"
    assert telegram_html(r"**2 \* 3 = 6**") == "<b>2 * 3 = 6</b>"


def test_a_backslash_in_code_stays() -> None:
    md = "`a\\*b` and \\*\n```\nx = a\\*b\n```"
    assert telegram_html(md) == "<code>a\\*b</code> and *\n<pre><code>x = a\\*b</code></pre>"
    assert whatsapp_text(md) == slack_mrkdwn(md) == plain_text(md) == "`a\\*b` and *\n```\nx = a\\*b\n```"
    assert feishu_md(md) == md


def test_a_link_label_loses_its_escapes_and_its_target_keeps_them() -> None:
    md = r"see [a\_b \<c\>](https://x.io/a\_b) now"
    assert telegram_html(md) == 'see <a href="https://x.io/a\\_b">a_b &lt;c&gt;</a> now'
    assert slack_mrkdwn(md) == "see <https://x.io/a\\_b|a_b &lt;c&gt;> now"
    assert whatsapp_text(md) == "see a_b <c> (https://x.io/a\\_b) now"
    assert feishu_md(md) == md


ESCAPABLE = "!\"#$%&'()*+,-./:;<=>?@[\\]^_{|}"  # ASCII punctuation but ` and ~ (a line of them is a fence)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.one_of(st.sampled_from(ESCAPABLE).map(lambda c: "\\" + c),
                                st.sampled_from(["a", "word", " ", "\n"])), max_size=40))
def test_escaped_punctuation_shows_as_itself_in_every_format(parts: list[str]) -> None:
    md = "".join(parts)
    shown = md.replace("\\\\", "\x00").replace("\\", "").replace("\x00", "\\")
    assert parse_entities(telegram_html(md)) == (shown, None)
    assert html.unescape(slack_mrkdwn(md)) == whatsapp_text(md) == plain_text(md) == shown


def test_italics_hold_bold_in_telegram_too() -> None:
    assert telegram_html("_a **b** c_ and *d __e__ f*") == "<i>a <b>b</b> c</i> and <i>d <b>e</b> f</i>"
    assert whatsapp_text("_a **b** c_") == "_a *b* c_"
    assert telegram_html("**a *b* c**") == "<b>a <i>b</i> c</b>"  # and bold italics, as before


# --------------------------------------------------------------------------- tables

QA_TABLE = "| a | b |\n|---|---|\n| x<y | **bold** |"


def test_a_table_goes_as_a_monospace_block_of_lined_up_cells() -> None:
    """QA saw the model's tables reach Telegram as raw pipe rows: chats draw no tables."""
    assert telegram_html(QA_TABLE) == "<pre><code>a   | b\n----+-----\nx&lt;y | bold</code></pre>"
    assert slack_mrkdwn(QA_TABLE) == "```\na   | b\n----+-----\nx&lt;y | bold\n```"
    assert whatsapp_text(QA_TABLE) == plain_text(QA_TABLE) == "```\na   | b\n----+-----\nx<y | bold\n```"
    assert feishu_md(QA_TABLE) == QA_TABLE  # whether a post's md element draws tables is unknown: as written


def test_a_table_keeps_the_prose_around_it_and_ends_where_its_pipes_do() -> None:
    md = "Prices:\n| item | € |\n|:-|-:|\n| tea | 3 |\n| [cake](https://x.io) | 12 |\nThat is all, **ok**?"
    assert whatsapp_text(md) == ("Prices:\n```\nitem                |  €\n"
                                 "--------------------+---\n"
                                 "tea                 |  3\n"
                                 "cake (https://x.io) | 12\n```\nThat is all, *ok*?")


def test_cells_line_up_by_what_a_monospace_font_shows() -> None:
    """A CJK character takes two columns; cells lose their marks (code, escapes) and are aligned as the
    delimiter row says; a short row is filled, a long one cut (as GFM does)."""
    md = "| 名前 | note | n |\n|:-:|---|--:|\n| 東京都 | `a\\|b` \\* x | 7 |\n| é |\n| a | b | 10 | extra |"
    assert plain_text(md).split("\n") == ["```",
                                          " 名前  | note    |  n",
                                          "-------+---------+---",
                                          "東京都 | a|b * x |  7",
                                          "  é    |         |",
                                          "  a    | b       | 10",
                                          "```"]


@pytest.mark.parametrize("md", ["a | b\nnot a delimiter", "| a | b |\n|---|", "a | b\n---", "| a |\n| -x- |",
                                "text\n\n|---|---|\n| 1 | 2 |"])
def test_what_is_not_a_table_is_left_as_prose(md: str) -> None:
    assert plain_text(md) == md
    assert "<pre>" not in telegram_html(md)


def test_a_table_inside_a_code_block_is_code() -> None:
    md = "```\n| a | b |\n|---|---|\n| **x** | > y |\n```"
    assert telegram_html(md) == "<pre><code>| a | b |\n|---|---|\n| **x** | &gt; y |</code></pre>"
    assert slack_mrkdwn(md) == "```\n| a | b |\n|---|---|\n| **x** | &gt; y |\n```"
    assert whatsapp_text(md) == plain_text(md) == feishu_md(md) == md


ROW_TEXT = st.text(st.sampled_from("ab é中😀*_ -:<&"), max_size=8)


def _columns(line: str) -> list[int]:
    """The display column of each `|` in a line (a wide East Asian character takes two)."""
    width = [2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in line]
    return [sum(width[:i]) for i, c in enumerate(line) if c == "|"]


@settings(max_examples=200, deadline=None)
@given(grid=st.integers(1, 4).flatmap(lambda n: st.lists(st.lists(ROW_TEXT, min_size=n, max_size=n), min_size=1,
                                                          max_size=5)))
def test_every_row_of_a_table_lines_up(grid: list[list[str]]) -> None:
    md = "\n".join(["| " + " | ".join(f"h{i}" for i in range(len(grid[0]))) + " |",
                    "|" + "---|" * len(grid[0])] + ["| " + " | ".join(row) + " |" for row in grid])
    lines = plain_text(md).split("\n")[1:-1]
    lines[1] = lines[1].replace("+", "|")  # the rule under the header crosses the column lines
    assert len(lines) == len(grid) + 2 and len(_columns(lines[0])) == len(grid[0]) - 1
    assert all(_columns(line) == _columns(lines[0]) for line in lines)
    assert parse_entities(telegram_html(md))[1] is None


# --------------------------------------------------------------------------- quotes

QUOTE = "> quoted **b** & <x>\n> two\nafter a > b"


def test_a_quote_is_a_quote_in_each_format() -> None:
    """Telegram showed `&gt; quoted line`: its HTML has a blockquote. Slack's quote is a `>` at a line's
    start, which must not be escaped; WhatsApp's is `> `."""
    assert telegram_html(QUOTE) == "<blockquote>quoted <b>b</b> &amp; &lt;x&gt;\ntwo</blockquote>\nafter a &gt; b"
    assert slack_mrkdwn(QUOTE) == "> quoted *b* &amp; &lt;x&gt;\n> two\nafter a &gt; b"
    assert whatsapp_text(QUOTE) == "> quoted *b* & <x>\n> two\nafter a > b"
    assert plain_text(QUOTE) == "> quoted b & <x>\n> two\nafter a > b"
    assert feishu_md(QUOTE) == QUOTE


def test_quote_marks_as_commonmark_reads_them() -> None:
    """No space after `>`, up to three before, a quote in a quote (chats nest none: one quote)."""
    md = ">tight\n   > indented\n>> nested *it*"
    assert telegram_html(md) == "<blockquote>tight\nindented\nnested <i>it</i></blockquote>"
    assert slack_mrkdwn(md) == whatsapp_text(md) == "> tight\n> indented\n> nested _it_"
    assert telegram_html("> a\n\n> b") == "<blockquote>a</blockquote>\n\n<blockquote>b</blockquote>"
    assert telegram_html(">\n> ") == "\n"  # a quote of nothing: no empty blockquote
    assert telegram_html("    > code-like") == "    &gt; code-like"  # four spaces: not a quote mark


def test_a_quote_mark_inside_a_code_block_is_code() -> None:
    md = "```\n> not a quote\n```"
    assert telegram_html(md) == "<pre><code>&gt; not a quote</code></pre>"
    assert slack_mrkdwn(md) == "```\n&gt; not a quote\n```"
    assert whatsapp_text(md) == md
