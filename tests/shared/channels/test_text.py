"""Chunking and markdown conversion: property tests (pieces rejoin to the original text, each under
the limit, fences balanced in every piece; Telegram HTML always parses) and examples."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared.channels.discord import DiscordChannel
from shared.channels.feishu import FeishuChannel
from shared.channels.slack import SlackChannel
from shared.channels.telegram import TelegramChannel
from shared.channels.text import (
    FENCE,
    format_chunks,
    identity,
    is_fence,
    open_fence,
    plain_text,
    slack_mrkdwn,
    split_text,
    telegram_html,
)
from shared.channels.webhook import WebhookChannel
from shared.channels.whatsapp import WhatsAppChannel
from shared.settings import Settings
from tests.fakes.telegram import parse_entities

FRAGMENTS = ["\n", "\n\n", ". ", "! ", " ", "```python\n", "```\n", "```", "``", "**", "*", "_", "__", "~~", "`",
             "<", ">", "&", "&amp;", "# ", "- ", "* ", "[link](https://example.com/a?b=1&c=2)", "。", "é", "😀",
             "```" + "x" * 40 + "\n"]
markdown = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=40)), max_size=60).map("".join)
FORMATS = {"telegram": telegram_html, "slack": slack_mrkdwn, "plain": plain_text, "identity": identity}


def balanced(chunk: str) -> bool:
    return open_fence(chunk) is None


@settings(max_examples=400, deadline=None)
@given(text=markdown, limit=st.integers(16, 300))
def test_pieces_rejoin_fit_and_keep_fences_balanced(text: str, limit: int) -> None:
    pieces = split_text(text, limit)
    assert "".join(p.body for p in pieces) == text
    for p in pieces:
        assert p.body and len(str(p)) <= limit
        assert balanced(str(p))
        assert p.reopen == "" or (is_fence(p.reopen) and p.reopen.endswith("\n") and p.reopen.count("\n") == 1)
        assert p.close in ("", FENCE, "\n" + FENCE)


@settings(max_examples=300, deadline=None)
@given(text=markdown, limit=st.integers(200, 600), fmt=st.sampled_from(sorted(FORMATS)))
@example(text="#  ", limit=200, fmt="plain")  # a heading of spaces used to give a blank chunk
@example(text="# ```python\n**```**\n[```](https://x.y)", limit=200, fmt="plain")  # markup hid a fence
@example(text="**```**\n", limit=200, fmt="slack")
def test_formatted_chunks_fit_and_stay_valid(text: str, limit: int, fmt: str) -> None:
    for chunk in format_chunks(text, limit, FORMATS[fmt]):
        assert 0 < len(chunk) <= limit and chunk.strip()
        if fmt == "telegram":
            assert parse_entities(chunk)[1] is None, chunk
        else:
            assert balanced(chunk), chunk


@settings(max_examples=300, deadline=None)
@given(text=markdown)
def test_telegram_html_always_parses(text: str) -> None:
    assert parse_entities(telegram_html(text))[1] is None


@pytest.mark.parametrize("channel", [TelegramChannel, SlackChannel, WhatsAppChannel, FeishuChannel, DiscordChannel,
                                     WebhookChannel])
def test_each_platform_chunks_under_its_limit(channel: type[TelegramChannel]) -> None:
    code = "\n".join(f"line_{i} = {i} & {i} < {i + 1}" for i in range(3000))
    text = ("Intro **bold** & <b>. " * 200) + "\n\n```python\n" + code + "\n```\n\n" + "Outro. " * 300
    chunks = channel(Settings()).chunks(text)
    assert len(chunks) >= 2
    assert all(len(c) <= channel.max_chars for c in chunks)
    if channel is TelegramChannel:
        assert all(parse_entities(c)[1] is None for c in chunks)
    else:
        assert all(balanced(c) for c in chunks)


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


def test_whitespace_only_pieces_are_dropped() -> None:
    assert format_chunks("```\n\n```", 100, identity) == []
    for text in ("hi" + " " * 60 + "there", "a\n\n\n\n\n\n\n\nb" * 10):
        chunks = format_chunks(text, 16, identity)
        assert chunks and not any(re.fullmatch(r"\s*", c) for c in chunks)
