"""Chunking and markdown conversion: property tests (pieces rejoin to the original text, each under
the limit in the platform's own unit, fences balanced in every piece; Telegram HTML always parses)
and examples."""

from __future__ import annotations

import html
import itertools
import re
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared.channels.discord import DiscordChannel
from shared.channels.feishu import FeishuChannel
from shared.channels.markdown import feishu_md, identity, plain_text, slack_mrkdwn, telegram_html, whatsapp_text
from shared.channels.slack import SlackChannel
from shared.channels.telegram import TelegramChannel
from shared.channels.text import fence_of, format_chunks, is_fence, open_fence, split_text
from shared.channels.webhook import WebhookChannel
from shared.channels.whatsapp import WhatsAppChannel
from shared.settings import Settings
from tests.fakes.telegram import parse_entities

FRAGMENTS = ["\n", "\n\n", ". ", "! ", " ", "```python\n", "```\n", "```", "``", "**", "*", "_", "__", "~~", "`",
             "<", ">", "&", "&amp;", "# ", "- ", "* ", "[link](https://example.com/a?b=1&c=2)", "。", "é", "😀",
             "```" + "x" * 40 + "\n", "~~~\n", "~~~", "~~~~python\n", "````\n", "````", "~~~~~~~~\n",
             "https://x.io/__init__.py", "[w](https://w.org/A_(b))", "https://x.io/a_b_.", "***", "___", "!",
             "![i](https://e.com/i.png)", "a" * 300]
markdown = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=40)), max_size=60).map("".join)
FORMATS = {"telegram": telegram_html, "slack": slack_mrkdwn, "whatsapp": whatsapp_text, "feishu": feishu_md,
           "plain": plain_text, "identity": identity}


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


MEASURES: dict[str, Callable[[str], int]] = {"len": len, "utf16": utf16}


def visible(chunk: str) -> str:
    """The text Telegram shows for an HTML message."""
    return parse_entities(chunk)[0]


def balanced(chunk: str) -> bool:
    return open_fence(chunk) is None


@settings(max_examples=400, deadline=None)
@given(text=markdown, limit=st.integers(16, 300), unit=st.sampled_from(sorted(MEASURES)))
@example(text="😀" * 40, limit=16, unit="utf16")
def test_pieces_rejoin_fit_and_keep_fences_balanced(text: str, limit: int, unit: str) -> None:
    measure = MEASURES[unit]
    pieces = split_text(text, limit, measure=measure)
    assert "".join(p.body for p in pieces) == text
    for p in pieces:
        assert p.body and measure(str(p)) <= limit
        assert balanced(str(p))
        assert p.reopen == "" or (is_fence(p.reopen) and p.reopen.endswith("\n") and p.reopen.count("\n") == 1)
        closer = fence_of(p.close.lstrip("\n"))
        assert p.close == "" or (closer is not None and not closer.info and p.close.count("\n") <= 1)


@settings(max_examples=300, deadline=None)
@given(text=markdown, limit=st.integers(200, 600), fmt=st.sampled_from(sorted(FORMATS)),
       unit=st.sampled_from(sorted(MEASURES)))
@example(text="#  ", limit=200, fmt="plain", unit="len")  # a heading of spaces used to give a blank chunk
@example(text="# ```python\n**```**\n[```](https://x.y)", limit=200, fmt="plain", unit="len")  # markup hid a fence
@example(text="**```**\n", limit=200, fmt="slack", unit="len")
@example(text="**😀**" * 300, limit=200, fmt="telegram", unit="utf16")
def test_formatted_chunks_fit_and_stay_valid(text: str, limit: int, fmt: str, unit: str) -> None:
    for chunk in format_chunks(text, limit, FORMATS[fmt], measure=MEASURES[unit]):
        assert 0 < MEASURES[unit](chunk) <= limit and chunk.strip()
        if fmt == "telegram":
            assert parse_entities(chunk)[1] is None, chunk
        else:
            assert balanced(chunk), chunk


@settings(max_examples=300, deadline=None)
@given(text=markdown, limit=st.integers(200, 600))
@example(text="<&>" * 300, limit=200)
def test_telegram_chunks_fit_what_telegram_counts_and_escaping_adds_none(text: str, limit: int) -> None:
    """Telegram counts the text it shows (tags gone, entities read): `&lt;` is one, not four. So
    HTML never needs more chunks than the markdown it came from."""
    chunks = format_chunks(text, limit, telegram_html, measure=TelegramChannel(Settings()).measure)
    for chunk in chunks:
        assert parse_entities(chunk)[1] is None, chunk
        assert 0 < utf16(visible(chunk)) <= limit and chunk.strip()
    assert len(chunks) <= len(split_text(text, limit, measure=utf16))


@settings(max_examples=300, deadline=None)
@given(text=markdown)
def test_telegram_html_always_parses(text: str) -> None:
    assert parse_entities(telegram_html(text))[1] is None


@pytest.mark.parametrize("channel", [TelegramChannel, SlackChannel, WhatsAppChannel, FeishuChannel, DiscordChannel,
                                     WebhookChannel])
def test_each_platform_chunks_under_its_limit(channel: type[TelegramChannel]) -> None:
    code = "\n".join(f"line_{i} = {i} & {i} < {i + 1}" for i in range(3000))
    text = ("Intro **bold** & <b>. " * 200) + "\n\n```python\n" + code + "\n```\n\n" + "Outro. " * 300
    ch = channel(Settings())
    chunks = ch.chunks(text)
    assert len(chunks) >= 2
    assert all(ch.measure(c) <= channel.max_chars for c in chunks)
    if channel is TelegramChannel:
        assert all(parse_entities(c)[1] is None for c in chunks)
    else:
        assert all(balanced(c) for c in chunks)


def test_telegram_chunks_fit_its_limit_in_utf16_code_units() -> None:
    """Telegram counts 4096 in UTF-16 code units: an emoji is two. A chunk of 4096 characters of
    emoji is twice too long, and Telegram refuses it for good."""
    text = ("Party time 🎉🎉🎉 " + "😀" * 40 + "\n") * 150 + "```\n" + "🚀 " * 3000 + "\n```"
    chunks = TelegramChannel(Settings()).chunks(text)
    assert chunks and all(utf16(visible(c)) <= TelegramChannel.max_chars for c in chunks)
    assert all(parse_entities(c)[1] is None for c in chunks)
    slack = SlackChannel(Settings()).chunks(text)  # other platforms still count characters
    assert SlackChannel.max_chars // 2 < max(len(c) for c in slack) <= SlackChannel.max_chars


def test_telegram_measures_the_text_it_shows() -> None:
    measure = TelegramChannel(Settings()).measure
    assert measure('<b>a &lt; b</b> <a href="https://x.io/?a=1&amp;b=2">x</a>') == 7
    assert measure("<pre><code>&amp;&gt;</code></pre>😀") == 4  # an emoji is two UTF-16 code units


def test_a_reply_full_of_escaped_characters_is_cut_by_what_telegram_shows() -> None:
    """`<&>` becomes `&lt;&amp;&gt;`: 13 characters of HTML that Telegram shows, and counts, as 3.
    Counted as HTML, 4,506 characters went out as 12 messages, some of 6 and 34 characters."""
    text = "echo: " + "<&>" * 1500
    chunks = TelegramChannel(Settings()).chunks(text)
    assert len(chunks) == 2
    assert "".join(visible(c) for c in chunks) == text
    assert all(parse_entities(c)[1] is None and utf16(visible(c)) <= TelegramChannel.max_chars for c in chunks)


def test_code_full_of_escaped_characters_goes_in_even_telegram_chunks() -> None:
    code = "\n".join(f"if a[{i}] < b && c > {i}: x = '<tag attr=\"&amp;\">'" for i in range(400))
    text = "Here is the code:\n\n```python\n" + code + "\n```\n\nThat is all & done."
    chunks = TelegramChannel(Settings()).chunks(text)
    sizes = [utf16(visible(c)) for c in chunks]
    assert len(chunks) == len(split_text(text, TelegramChannel.max_chars, measure=utf16)) == 5
    assert all(TelegramChannel.max_chars // 2 < size <= TelegramChannel.max_chars for size in sizes[:-1]), sizes
    assert all(parse_entities(c)[1] is None for c in chunks)


def test_markup_that_outgrows_the_limit_is_cut_again_without_tiny_pieces() -> None:
    """Slack counts its escaped text: a piece whose markup outgrows the limit is cut again, only as
    much smaller as needed, and the rest goes on in the next piece, not in a piece of its own."""
    chunks = SlackChannel(Settings()).chunks("echo: " + "<&>" * 1500)
    sizes = [len(c) for c in chunks]
    assert len(chunks) == 5 and all(SlackChannel.max_chars * 3 // 4 < size <= SlackChannel.max_chars
                                     for size in sizes[:-1]), sizes


@pytest.mark.parametrize("channel", [TelegramChannel, SlackChannel])
def test_a_word_longer_than_a_chunk_fills_the_chunk_it_starts_in(channel: type[TelegramChannel]) -> None:
    """The word has to be cut anyway: "echo: " alone in a first message helps nobody."""
    text = "echo: " + "a" * 5000
    chunks = channel(Settings()).chunks(text)
    assert len(chunks) == 2 and chunks[0].startswith("echo: aaa") and "".join(chunks) == text
    assert len(chunks[0]) > channel.max_chars - 10


def test_a_long_word_that_fits_a_chunk_of_its_own_is_not_cut() -> None:
    text = "hello " + "a" * 20 + " " + "b" * 20
    assert [p.body for p in split_text(text, 30)] == ["hello ", "a" * 20 + " ", "b" * 20]
    assert split_text("x " + "a" * 40, 30)[0].body == "x " + "a" * 24  # 40 fits no chunk: cut where it starts


def test_cuts_prefer_paragraphs_then_lines_then_sentences() -> None:
    para = "First paragraph. It has two sentences.\n\nSecond paragraph here."
    assert [p.body for p in split_text(para, 50)] == ["First paragraph. It has two sentences.\n\n",
                                                      "Second paragraph here."]
    lines = "line one is here\nline two is here\nline three"
    assert split_text(lines, 40)[0].body == "line one is here\nline two is here\n"
    sentences = "One sentence. Two sentence. Three sentence goes on."
    assert split_text(sentences, 34)[0].body == "One sentence. Two sentence. "


def test_a_code_block_cut_in_two_is_closed_and_reopened() -> None:
    text = "Intro\n```python\n" + "\n".join(f"x{i} = {i}" for i in range(20)) + "\n```\nAfter"
    pieces = [str(p) for p in split_text(text, 60)]
    assert len(pieces) > 2
    assert pieces[0].startswith("Intro\n```python\n") and pieces[0].endswith("```")
    assert all(p.startswith("```python\n") for p in pieces[1:])
    assert pieces[-1].endswith("```\nAfter")


def test_telegram_html() -> None:
    md = "# Title\nSome **bold**, *it*, ~~gone~~ & <tag> [a link](https://x.io/?a=1&b=2) and `x<y`\n- item"
    assert telegram_html(md) == (
        "<b>Title</b>\nSome <b>bold</b>, <i>it</i>, <s>gone</s> &amp; &lt;tag&gt; "
        '<a href="https://x.io/?a=1&amp;b=2">a link</a> and <code>x&lt;y</code>\n• item')
    assert telegram_html("```py\nif a<b: pass\n```") == '<pre><code class="language-py">if a&lt;b: pass</code></pre>'
    assert telegram_html("2*3*4 and snake_case_name") == "2*3*4 and snake_case_name"
    assert telegram_html("**a _b** c_") in ("<b>a _b</b> c_", "**a _b** c_")  # never crossed tags


def test_slack_mrkdwn_and_plain_text() -> None:
    md = "**bold** *it* ~~gone~~ [site](https://x.io) a<b & c\n```js\nlet a = 1 < 2\n```"
    assert slack_mrkdwn(md) == "*bold* _it_ ~gone~ <https://x.io|site> a&lt;b &amp; c\n```\nlet a = 1 &lt; 2\n```"
    assert plain_text(md) == "bold it gone site (https://x.io) a<b & c\n```\nlet a = 1 < 2\n```"
    assert slack_mrkdwn("# **Title**\n## A **bold** word") == "*Title*\n*A bold word*"  # Slack nests no bold


def test_whatsapp_keeps_its_own_marks() -> None:
    md = "# Plan\n**bold** *it* ~~gone~~ [site](https://x.io) a<b & `x*y`\n- one\n```py\nlet a = 1 < 2\n```"
    assert whatsapp_text(md) == ("*Plan*\n*bold* _it_ ~gone~ site (https://x.io) a<b & `x*y`\n• one\n"
                                 "```\nlet a = 1 < 2\n```")
    assert whatsapp_text("**5* stars** for snake_case") == "*5\u2217 stars* for snake_case"


def test_feishu_keeps_markdown_but_makes_headings_bold() -> None:
    md = "# **Plan**\n- one **b** [a](https://x.io) `#c`\n~~~py\n# a comment, not a heading\n~~~\n### Next"
    assert feishu_md(md) == ("**Plan**\n- one **b** [a](https://x.io) `#c`\n~~~py\n# a comment, not a heading\n~~~\n"
                             "**Next**")


def test_a_feishu_reply_never_pings_anyone() -> None:
    """`<at user_id="all"></at>` in an `md` element notifies the whole group: a user (or a page the model
    read) could have the bot repeat it. Every mention tag goes out as text; a code block keeps its own."""
    said = 'repeat <at user_id="all"></at> meeting now, < AT id=ou_1>x</at> and <atom> <b>'
    assert feishu_md(said) == ('repeat <\u200bat user_id="all"></at> meeting now, <\u200b AT id=ou_1>x</at> '
                               "and <atom> <b>")
    assert feishu_md('```\n<at user_id="all"></at>\n```') == '```\n<at user_id="all"></at>\n```'


def test_a_literal_asterisk_in_slack_bold_shows_as_a_look_alike() -> None:
    """mrkdwn has no escape for `*` (only &, < and > are escaped), and one inside bold ends it early:
    the heading `Rated 5* overall` showed as bold "Rated 5" then " overall*", or lost its star."""
    assert slack_mrkdwn("# Rated 5* overall") == "*Rated 5\u2217 overall*"
    assert slack_mrkdwn("## 2 * 3 = 6, *really*") == "*2 \u2217 3 = 6, _really_*"
    assert slack_mrkdwn("### `a*b` is **not** a*b") == "*`a*b` is not a\u2217b*"  # code shows as written
    assert slack_mrkdwn("**5* stars** and 2 * 3") == "*5\u2217 stars* and 2 * 3"  # outside bold, * is plain


def test_whitespace_only_pieces_are_dropped() -> None:
    assert format_chunks("```\n\n```", 100, identity) == []
    for text in ("hi" + " " * 60 + "there", "a\n\n\n\n\n\n\n\nb" * 10):
        chunks = format_chunks(text, 16, identity)
        assert chunks and not any(re.fullmatch(r"\s*", c) for c in chunks)


# --------------------------------------------------------------------------- links and bare URLs

URL_CHARS = st.sampled_from(["_", "__", "*", "**", "~~", "a", "b1", "-", ".", "/", "?x=1&y=2", "#frag", "(c)"])
urls = st.lists(URL_CHARS, min_size=1, max_size=12).map(lambda parts: "https://ex.io/" + "".join(parts) + "z")


@settings(max_examples=200, deadline=None)
@given(url=urls, around=st.sampled_from(["{}", "see {} now", "**see {}**", "_{}_", "({})", "- {}", "# {}"]))
def test_bare_urls_survive_every_format(url: str, around: str) -> None:
    text = around.format(url)
    assert url in plain_text(text)
    assert url.replace("&", "&amp;") in slack_mrkdwn(text)
    assert url.replace("&", "&amp;") in telegram_html(text)
    assert parse_entities(telegram_html(text))[1] is None


@settings(max_examples=200, deadline=None)
@given(url=urls, label=st.sampled_from(["docs", "the **spec**", "a_b_c"]))
def test_link_targets_are_never_rewritten(url: str, label: str) -> None:
    text = f"read [{label}]({url}) and **this**"
    assert f'href="{url.replace("&", "&amp;")}"' in telegram_html(text)
    assert f"<{url.replace('&', '&amp;')}|" in slack_mrkdwn(text)
    assert f"({url})" in plain_text(text)
    assert "<b>this</b>" in telegram_html(text)


def test_urls_keep_their_underscores_and_parentheses() -> None:
    text = "see https://x.io/pkg/__init__.py and [Foo](https://en.wikipedia.org/wiki/Foo_(bar)), **ok**"
    assert telegram_html(text) == ('see https://x.io/pkg/__init__.py and '
                                   '<a href="https://en.wikipedia.org/wiki/Foo_(bar)">Foo</a>, <b>ok</b>')
    assert slack_mrkdwn(text) == ("see https://x.io/pkg/__init__.py and "
                                  "<https://en.wikipedia.org/wiki/Foo_(bar)|Foo>, *ok*")
    assert plain_text(text) == "see https://x.io/pkg/__init__.py and Foo (https://en.wikipedia.org/wiki/Foo_(bar)), ok"
    assert telegram_html("(at https://x.io/a_b_.)") == "(at https://x.io/a_b_.)"  # trailing punctuation is prose


def test_a_url_with_emphasis_marks_does_not_cost_the_line_its_formatting() -> None:
    assert telegram_html("[x](https://x.io/a**b**c) is **bold**\n*it*") == (
        '<a href="https://x.io/a**b**c">x</a> is <b>bold</b>\n<i>it</i>')


# --------------------------------------------------------------------------- ~~~ and longer fences


def test_tilde_and_long_fences_are_code_blocks() -> None:
    assert telegram_html("~~~\n**x** _y_\n~~~") == "<pre><code>**x** _y_</code></pre>"
    nested = "````md\n```python\nx = 1\n```\n**not bold**\n````\n**bold**"
    assert telegram_html(nested) == ('<pre><code class="language-md">```python\nx = 1\n```\n**not bold**</code></pre>'
                                     "\n<b>bold</b>")
    assert telegram_html("~~~\n```\n**x**\n~~~") == "<pre><code>```\n**x**</code></pre>"  # ``` does not close ~~~
    assert telegram_html("```\n~~~\n**x**\n```") == "<pre><code>~~~\n**x**</code></pre>"
    assert telegram_html("```\n``\n```python\n**x**\n```") == "<pre><code>``\n```python\n**x**</code></pre>"
    assert plain_text("~~~sh\nls *.py\n~~~") == "```\nls *.py\n```"  # WhatsApp knows ``` only
    assert slack_mrkdwn("~~~\n```\nx\n~~~") == "~~~\n```\nx\n~~~"  # ``` would end it early: keep its own fence
    assert open_fence("~~~\nx\n```") is not None and open_fence("````\nx\n```\n````") is None


@settings(max_examples=300, deadline=None)
@given(code=markdown, fence=st.sampled_from(["```", "~~~", "````", "~~~~~"]), lang=st.sampled_from(["", "python"]))
def test_code_inside_any_fence_is_never_converted(code: str, fence: str, lang: str) -> None:
    code = "\n".join(line for line in code.split("\n") if not is_fence(line))  # a fence line would end it
    block = f"{fence}{lang}\n{code}\n{fence}"
    attr = f' class="language-{lang}"' if lang else ""
    assert telegram_html(block) == f"<pre><code{attr}>{html.escape(code, quote=False)}</code></pre>"
    assert "\n".join(plain_text(block).split("\n")[1:-1]) == code


def test_a_long_tilde_block_is_closed_and_reopened_and_never_converted() -> None:
    code = "\n".join(f"**line {i}** _x_ ~~y~~" for i in range(40))
    text = f"Intro\n\n~~~python\n{code}\n~~~\nAfter **b**"
    pieces = [str(p) for p in split_text(text, 120)]
    assert len(pieces) > 3
    assert pieces[0].startswith("Intro\n\n~~~python\n") and pieces[0].endswith("\n~~~")
    assert all(p.startswith("~~~python\n") for p in pieces[1:])
    assert all(balanced(p) for p in pieces)
    html_chunks = format_chunks(text, 300, telegram_html)
    assert "".join(html_chunks).count("<b>") == 1  # only "After **b**": nothing inside the block
    assert all(c.startswith("<pre>") for c in html_chunks[1:-1])


# --------------------------------------------------------------------------- emphasis and links cut in two

WORDS = " ".join(["word"] * 1200)


def test_bold_cut_in_two_is_closed_and_reopened() -> None:
    """A bold paragraph longer than a message went out as `**word ...` and `... word**`: each half
    unpaired, its marks shown as written."""
    chunks = WhatsAppChannel(Settings()).chunks(f"**{WORDS}**")
    assert len(chunks) == 2 and "**" not in "".join(chunks)
    assert all(c.startswith("*word") and c.rstrip().endswith("word*") for c in chunks)
    telegram = TelegramChannel(Settings()).chunks(f"Intro.\n\n**{WORDS * 2}** and after")
    assert len(telegram) == 3 and "**" not in "".join(telegram)
    assert all(parse_entities(c)[1] is None for c in telegram)
    assert telegram[1].startswith("<b>word") and telegram[2].endswith("word</b> and after")


def test_bold_and_strike_nested_are_closed_innermost_first() -> None:
    chunks = DiscordChannel(Settings()).chunks(f"**bold ~~{WORDS}~~ bold** ~~{WORDS}~~")
    ends = [(c[:4], c.rstrip()[-4:]) for c in chunks]
    assert ends[0] == ("**bo", "~~**") and ends[1] == ("**~~", "~~**")  # the inner mark closes first
    assert ends[-1] == ("~~wo", "rd~~") and all(c.count("**") % 2 == 0 == c.count("~~") % 2 for c in chunks)


def test_marks_in_code_escapes_and_urls_are_not_reopened() -> None:
    for text in (f"`**` {WORDS} `**`", f"\\*\\* {WORDS} \\*\\*", f"https://x.io/**a {WORDS} b**c/",
                 f"```\n**{WORDS}**\n```"):
        chunks = format_chunks(text, 2000, identity)
        assert len(chunks) > 1 and "".join(chunks).count("*") == 4, text[:12]  # no mark added


def test_a_link_or_inline_code_is_not_cut_inside() -> None:
    link = "[the " + "label " * 30 + "](https://x.io/a_(b))"
    code = "`" + "x " * 60 + "`"
    for inline in (link, code):
        chunks = DiscordChannel(Settings()).chunks("y " * 950 + inline + " z" * 950)
        assert sum(inline in c for c in chunks) == 1, inline[:10]


@settings(max_examples=200, deadline=None)
@given(words=st.lists(st.sampled_from(["a", "bb", "ccc dd", "é", "😀"]), min_size=200, max_size=600).map(" ".join),
       mark=st.sampled_from(["**", "~~", "__"]), limit=st.integers(200, 400),
       fmt=st.sampled_from(["whatsapp", "slack"]))
def test_a_long_emphasis_span_shows_no_marks_in_any_chunk(words: str, mark: str, limit: int, fmt: str) -> None:
    chunks = format_chunks(f"{mark}{words}{mark}", limit, FORMATS[fmt])
    assert len(chunks) > 1 and not any(m in c for c in chunks for m in ("**", "~~", "__")), chunks
    assert all(len(c) <= limit for c in chunks)


# --------------------------------------------------------------------------- tables and quotes cut in two

HEADER = "| # | Name | Note |\n|--:|:--|---|\n"
TABLE = "Results:\n\n" + HEADER + "".join(f"| {i:03} | item {i:03} | a<b & **{i}** |\n" for i in range(400)) + "\nDone."


def test_a_long_table_goes_on_under_its_header_in_every_telegram_chunk() -> None:
    """Each chunk is a message of its own: a table cut in two goes on in a <pre> of its own, under its
    header again, every tag balanced."""
    chunks = TelegramChannel(Settings()).chunks(TABLE)
    assert len(chunks) >= 3 and all(parse_entities(c)[1] is None for c in chunks)
    assert all(utf16(visible(c)) <= TelegramChannel.max_chars for c in chunks)
    assert all(c.count("<pre>") == 1 and "<pre><code>  # | Name     | Note\n" in c for c in chunks)
    assert re.findall(r"item \d+", "".join(chunks)) == [f"item {i:03}" for i in range(400)]  # each row once
    assert "|--" not in "".join(chunks) and chunks[-1].endswith("</pre>\n\nDone.")


@pytest.mark.parametrize("channel", [SlackChannel, WhatsAppChannel])
def test_a_long_table_goes_on_under_its_header_in_every_chunk(channel: type[SlackChannel]) -> None:
    chunks = channel(Settings()).chunks(TABLE)
    assert len(chunks) >= 3 and all(balanced(c) and c.count("```") == 2 for c in chunks)
    assert all("```\n  # | Name     | Note\n" in c for c in chunks)
    assert re.findall(r"item \d+", "".join(chunks)) == [f"item {i:03}" for i in range(400)]  # each row once


@pytest.mark.parametrize("limit", range(40, 80))
def test_a_cut_never_parts_a_table_header_from_its_rows(limit: int) -> None:
    """Rows without the header and delimiter rows above them are no table: they would go as raw pipes."""
    text = "Intro line here.\n" + HEADER + "| 1 | one | x |\n| 2 | two | y |\nOutro."
    bodies = [p.body for p in split_text(text, limit)]
    assert "".join(bodies) == text
    for before, after in itertools.pairwise(bodies):
        assert not before.endswith("|---|\n") and not after.startswith(("|--:|", "| 1 |")), bodies


def test_a_long_quote_is_a_blockquote_in_every_telegram_chunk() -> None:
    chunks = TelegramChannel(Settings()).chunks("".join(f"> line {i} of the **quote**\n" for i in range(400)))
    assert len(chunks) >= 2 and all(parse_entities(c)[1] is None for c in chunks)
    assert all(c.startswith("<blockquote>line") and c.rstrip().endswith("</blockquote>") for c in chunks)


BLOCKS = [*FRAGMENTS, "| a | b |\n", "|---|:-:|\n", "| x<y | **b** |\n", "| 中文 | 😀 |\n", "|", "> ", ">> ",
          HEADER, "a|b\n-|-\n"]
with_blocks = st.lists(st.one_of(st.sampled_from(BLOCKS), st.text(max_size=20)), max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=with_blocks, limit=st.integers(200, 600), fmt=st.sampled_from(sorted(FORMATS)),
       unit=st.sampled_from(sorted(MEASURES)))
def test_chunks_of_tables_and_quotes_fit_and_stay_valid(text: str, limit: int, fmt: str, unit: str) -> None:
    for chunk in format_chunks(text, limit, FORMATS[fmt], measure=MEASURES[unit]):
        assert 0 < MEASURES[unit](chunk) <= limit and chunk.strip()
        if fmt == "telegram":
            assert parse_entities(chunk)[1] is None and visible(chunk).strip(), chunk
        else:
            assert balanced(chunk), chunk


@settings(max_examples=300, deadline=None)
@given(text=with_blocks)
def test_telegram_html_of_tables_and_quotes_always_parses(text: str) -> None:
    assert parse_entities(telegram_html(text))[1] is None
