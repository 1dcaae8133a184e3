"""Markdown as LLMs write it, converted without stray marks: bold italic, images, bold inside a word."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shared.channels.markdown import plain_text, slack_mrkdwn, telegram_html, whatsapp_text

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
