"""`http_get`: one GET of a public URL (SSRF-guarded), returning status, headers and the body text."""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.settings import Permission
from shared.tools.base import Tool, ToolContext, ToolResult
from shared.tools.fetch import Fetched, fetch_result

TEXTUAL = ("text/", "application/json", "application/xml", "application/xhtml", "application/javascript",
           "application/ld+json", "application/rss", "application/atom", "+json", "+xml")
MAX_CHARS = 50_000


class HttpGetArgs(BaseModel):
    url: str = Field(min_length=1, max_length=8_000, description="http or https URL")


def describe(page: Fetched) -> dict[str, object]:
    """The response as the model reads it; binary bodies are only described."""
    out: dict[str, object] = {"url": page.url, "status": page.status, "headers": page.headers}
    textual = not page.content_type or any(t in page.content_type for t in TEXTUAL)
    if textual:
        text = page.text()
        out["body"] = text[:MAX_CHARS]
        out["truncated"] = page.truncated or len(text) > MAX_CHARS
    else:
        out["body"] = f"[{page.content_type} body, {len(page.body)} bytes, not shown]"
        out["truncated"] = page.truncated
    return out


class HttpGetTool(Tool):
    name = "http_get"
    description = ("GET a public http(s) URL and return status, main headers and the body as text "
                   "(e.g. a JSON API). Private and local addresses are refused.")
    Args = HttpGetArgs
    group = "web"
    permissions = frozenset({Permission.NET_HTTP})
    idempotent = True
    timeout = 120.0  # the outer bound; each call has settings.tools.web.http_timeout
    max_output_bytes = 256_000

    async def run(self, args: HttpGetArgs, ctx: ToolContext) -> ToolResult:
        page = await fetch_result(args.url, ctx.settings, timeout=ctx.settings.tools.web.http_timeout)
        if isinstance(page, ToolResult):
            return page
        return ToolResult.success(describe(page), untrusted=True)
