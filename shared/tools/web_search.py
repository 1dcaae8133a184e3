"""`web_search`: title, URL and snippet of the top results, from a pluggable backend
(DuckDuckGo through ddgs by default, no key; Brave Search with an API key)."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, Field

from shared.settings import Permission, Settings
from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult


class WebSearchArgs(BaseModel):
    query: str = Field(min_length=1, max_length=400, description="What to search for")
    count: int = Field(default=5, ge=1, le=10, description="Number of results (1-10)")


@dataclass
class Hit:
    title: str
    url: str
    snippet: str


class SearchError(Exception):
    """The backend could not answer; `retryable` when trying again may help."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class SearchBackend(Protocol):
    """A search engine."""

    async def search(self, query: str, count: int) -> list[Hit]: ...


class DuckDuckGo:
    """DuckDuckGo through the ddgs package, without an API key."""

    def __init__(self, settings: Settings) -> None:
        self.timeout = int(settings.tools.web.fetch_timeout)

    def _search(self, query: str, count: int) -> list[Hit]:
        from ddgs import DDGS  # imported on use: it is slow to import

        rows: list[dict[str, Any]] = DDGS(timeout=self.timeout).text(query, max_results=count,
                                                                      backend="duckduckgo") or []
        return [Hit(str(r.get("title", "")), str(r.get("href", "")), str(r.get("body", ""))) for r in rows]

    async def search(self, query: str, count: int) -> list[Hit]:
        try:
            return (await asyncio.to_thread(self._search, query, count))[:count]
        except Exception as err:  # ddgs raises its own exception family for blocks and timeouts
            raise SearchError(f"DuckDuckGo search failed: {type(err).__name__}: {err}") from err


class Brave:
    """The Brave Search API (NANOFLEET_TOOLS__WEB__BRAVE_API_KEY)."""

    def __init__(self, settings: Settings) -> None:
        web = settings.tools.web
        self.base = web.brave_api_base.rstrip("/")
        self.key = web.brave_api_key.get_secret_value() if web.brave_api_key else ""
        self.timeout = web.fetch_timeout

    async def search(self, query: str, count: int) -> list[Hit]:
        if not self.key:
            raise SearchError("Brave search needs NANOFLEET_TOOLS__WEB__BRAVE_API_KEY", retryable=False)
        headers = {"Accept": "application/json", "X-Subscription-Token": self.key}
        try:
            async with httpx.AsyncClient(timeout=self.timeout, trust_env=False) as client:
                r = await client.get(f"{self.base}/web/search", params={"q": query, "count": count}, headers=headers)
        except httpx.HTTPError as err:
            raise SearchError(f"Brave search failed: {type(err).__name__}: {err}") from err
        if r.status_code != 200:
            raise SearchError(f"Brave search answered {r.status_code}: {r.text[:200]}",
                              retryable=r.status_code == 429 or r.status_code >= 500)
        results = (r.json().get("web") or {}).get("results") or []
        return [Hit(str(x.get("title", "")), str(x.get("url", "")), str(x.get("description", "")))
                for x in results[:count]]


BACKENDS: dict[str, type[DuckDuckGo] | type[Brave]] = {"duckduckgo": DuckDuckGo, "brave": Brave}


def backend_for(settings: Settings) -> SearchBackend:
    return BACKENDS[settings.tools.web.search_backend](settings)


class WebSearchTool(Tool):
    name = "web_search"
    description = ("Search the web. Returns up to `count` results (1-10), each with title, url and snippet. "
                   "Use web_fetch to read a result.")
    Args = WebSearchArgs
    group = "web"
    permissions = frozenset({Permission.NET_HTTP})
    idempotent = True
    timeout = 60.0

    async def run(self, args: WebSearchArgs, ctx: ToolContext) -> ToolResult:
        try:
            hits = await backend_for(ctx.settings).search(args.query, args.count)
        except SearchError as err:
            return ToolResult.fail(ErrorCode.FAILED, str(err), retryable=err.retryable)
        return ToolResult.success({"query": args.query, "results": [asdict(h) for h in hits]}, untrusted=True)
