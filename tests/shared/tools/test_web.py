"""web_fetch, http_get and web_search through the real registry, against loopback servers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from shared.tools import web_search
from shared.tools.base import ErrorCode
from shared.tools.registry import ToolRegistry
from tests.fakes.web import FakeWeb
from tests.shared.tools.conftest import call


@pytest.fixture
def reg(registry: Callable[..., ToolRegistry], web: FakeWeb) -> Callable[..., ToolRegistry]:
    def make(**web_settings: Any) -> ToolRegistry:
        return registry(allowed=["web_*", "http_get"], granted=["NET_HTTP"],
                        web={"allow_hosts": [web.host], **web_settings})

    return make


def test_web_fetch_extracts_readable_text_marked_untrusted(reg: Callable[..., ToolRegistry], web: FakeWeb) -> None:
    result = call(reg(), "web_fetch", {"url": f"{web.url}/page"})
    assert result.ok and result.untrusted
    page = result.output
    assert page["title"] == "Otters at home" and page["status"] == 200
    assert "hold hands while they sleep" in page["text"] and "Home | About" not in page["text"]
    assert result.for_model().startswith("[untrusted external content")


def test_web_fetch_honours_max_chars_and_formats_json(reg: Callable[..., ToolRegistry], web: FakeWeb) -> None:
    short = call(reg(), "web_fetch", {"url": f"{web.url}/page", "max_chars": 100}).output
    assert len(short["text"]) == 100 and short["truncated"] is True
    data = call(reg(), "web_fetch", {"url": f"{web.url}/json"}).output
    assert json.loads(data["text"]) == {"animal": "otter", "count": 3}


def test_http_get_returns_status_headers_and_body(reg: Callable[..., ToolRegistry], web: FakeWeb) -> None:
    result = call(reg(), "http_get", {"url": f"{web.url}/json"})
    assert result.ok and result.untrusted
    assert result.output["status"] == 200 and result.output["headers"]["content-type"] == "application/json"
    assert json.loads(result.output["body"]) == {"animal": "otter", "count": 3}
    missing = call(reg(), "http_get", {"url": f"{web.url}/nothing-here"})
    assert missing.ok and missing.output["status"] == 404


def test_non_latin_text_reaches_the_model_as_it_is(reg: Callable[..., ToolRegistry], web: FakeWeb) -> None:
    """Escaped (\\u4e2d), each character of a Chinese page cost six against the output cap and the
    model's tokens: 45,000 of them, under http_get's 50,000-character cap, failed as TOO_LARGE."""
    result = call(reg(), "http_get", {"url": f"{web.url}/repeat?c=中&n=45000"})
    assert result.ok and result.output["body"] == "中" * 45_000
    assert "中" * 45_000 in result.for_model() and "\\u4e2d" not in result.for_model()
    page = call(reg(), "web_fetch", {"url": f"{web.url}/repeat?c=é&n=5000"})
    assert page.ok and "é" * 5_000 in page.for_model()


def test_a_body_of_control_characters_is_shown_cut_not_refused(reg: Callable[..., ToolRegistry], web: FakeWeb) -> None:
    """Each control character is six bytes of JSON (\\u0001): 45,000 of them failed http_get as
    TOO_LARGE, and the model saw nothing of the page."""
    result = call(reg(), "http_get", {"url": f"{web.url}/repeat?c=%01&n=45000"})
    assert result.ok and result.output["body"] == "\ufffd" * 45_000, result
    page = call(reg(), "web_fetch", {"url": f"{web.url}/repeat?c=%00&n=150000", "max_chars": 100_000})
    assert page.ok and page.output["text"] == "\ufffd" * 100_000 and page.output["truncated"] is True, page
    kept = call(reg(), "http_get", {"url": f"{web.url}/repeat?c=%09&n=3"})  # tabs and line breaks are text
    assert kept.output["body"] == "\t" * 3


def test_brave_search(reg: Callable[..., ToolRegistry], web: FakeWeb) -> None:
    brave = reg(search_backend="brave", brave_api_key="brave-test-key", brave_api_base=f"{web.url}/brave")
    result = call(brave, "web_search", {"query": "sea otters", "count": 3})
    assert result.ok and result.untrusted
    hits = result.output["results"]
    assert [h["url"] for h in hits] == [f"https://example.com/{i}" for i in range(3)]
    assert hits[0] == {"title": "Result 0 for sea otters", "url": "https://example.com/0", "snippet": "Snippet 0"}
    assert web.brave_requests[-1] == {"token": "brave-test-key", "q": "sea otters", "count": "3"}


def test_search_count_is_bounded_and_errors_are_results(reg: Callable[..., ToolRegistry], web: FakeWeb) -> None:
    assert call(reg(), "web_search", {"query": "x", "count": 11}).error == ErrorCode.INVALID_ARGS
    assert call(reg(), "web_search", {"query": "x", "count": 0}).error == ErrorCode.INVALID_ARGS
    no_key = call(reg(search_backend="brave", brave_api_base=f"{web.url}/brave"), "web_search", {"query": "x"})
    assert no_key.error == ErrorCode.FAILED and "BRAVE_API_KEY" in no_key.message and not no_key.retryable
    bad_key = reg(search_backend="brave", brave_api_key="wrong-key", brave_api_base=f"{web.url}/brave")
    assert "401" in call(bad_key, "web_search", {"query": "x"}).message


class FakeDDGS:
    """Stands in for ddgs.DDGS: the network is not part of these tests."""

    rows = [{"title": "Otter", "href": "https://en.wikipedia.org/wiki/Otter", "body": "Otters are mammals."}]

    def __init__(self, timeout: int) -> None:
        self.timeout = timeout

    def text(self, query: str, **kw: Any) -> list[dict[str, str]]:
        if query == "fail":
            raise RuntimeError("ratelimited")
        return self.rows * int(kw["max_results"])


def test_duckduckgo_backend_maps_results(reg: Callable[..., ToolRegistry], monkeypatch: pytest.MonkeyPatch) -> None:
    import ddgs

    monkeypatch.setattr(ddgs, "DDGS", FakeDDGS)
    result = call(reg(), "web_search", {"query": "otter", "count": 2})
    assert result.output["results"] == [{"title": "Otter", "url": "https://en.wikipedia.org/wiki/Otter",
                                         "snippet": "Otters are mammals."}] * 2
    failed = call(reg(), "web_search", {"query": "fail"})
    assert failed.error == ErrorCode.FAILED and failed.retryable and "ratelimited" in failed.message
    assert web_search.BACKENDS["duckduckgo"] is web_search.DuckDuckGo
