"""Outbound GET for the web tools: SSRF-checked and pinned per hop, redirects followed by hand and
re-checked (at most 5), one deadline for the whole fetch, and a cap on the bytes read (after
decompression, which is done here, a bounded piece at a time)."""

from __future__ import annotations

import asyncio
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from shared.settings import Settings
from shared.tools.base import ErrorCode, ToolResult
from shared.tools.ssrf import Blocked, Target, Unresolvable, check_url, pinned_request

MAX_REDIRECTS = 5
REDIRECTS = {301, 302, 303, 307, 308}
HEADERS = {"User-Agent": "Mozilla/5.0 (compatible; nanofleet/0.1; +https://github.com/nanofleet)",
           "Accept": "text/html,application/xhtml+xml,application/json,text/plain;q=0.9,*/*;q=0.5",
           "Accept-Encoding": "gzip, deflate"}
# zlib wbits per content-encoding we can decompress with a bound on the output
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
HTML_TYPES = ("text/html", "application/xhtml+xml")
META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE)
LATIN = dict.fromkeys(("iso-8859-1", "latin1", "latin-1", "us-ascii", "ascii"), "cp1252")  # as browsers decode them
KEPT_HEADERS = ("content-type", "content-length", "last-modified", "etag", "location")
# Control characters but tab and line breaks: noise in a page's text, and six bytes each in the JSON
# the model reads (\u0001), so a body of them outgrew the tools' output cap and showed nothing at all
CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


class TooManyRedirects(Exception):
    """More than MAX_REDIRECTS hops."""


@dataclass
class Fetched:
    """A response as the tools use it."""

    url: str  # after redirects
    status: int
    headers: dict[str, str]
    body: bytes
    truncated: bool  # the body was cut at the size cap

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    def text(self) -> str:
        """The body as text, in the charset its header names, else the one an HTML page declares in
        a meta tag (as browsers read it), else UTF-8 (a byte order mark dropped); control characters
        read as U+FFFD, as bytes the charset cannot decode do."""
        charset = httpx.Headers(self.headers).get("content-type", "").partition("charset=")[2].strip(' "\'')
        if not charset and self.content_type in HTML_TYPES and (meta := META_CHARSET.search(self.body[:4096])):
            charset = meta[1].decode("ascii")
        charset = LATIN.get(charset.lower(), charset) or "utf-8-sig"
        try:
            text = self.body.decode(charset, errors="replace")
        except LookupError:
            text = self.body.decode("utf-8-sig", errors="replace")
        return CONTROLS.sub("\ufffd", text)


Decode = Callable[[bytes, int], bytes]  # (raw chunk, most bytes wanted) -> decoded bytes


def decoder(content_encoding: str) -> Decode:
    """A bounded decoder for the response's content-encoding: identity, gzip or deflate, and only
    one of them; stacked or other encodings raise httpx.DecodingError. A few KB of stacked gzip
    expand to gigabytes, so httpx's own decoding (a whole chunk at once) is not used."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return lambda chunk, room: chunk
    if len(codings) > 1 or codings[0] not in WBITS:
        raise httpx.DecodingError(f"content-encoding '{content_encoding}' is not supported: "
                                  f"at most one of {', '.join(WBITS)}")
    inflater = zlib.decompressobj(WBITS[codings[0]])

    def decode(chunk: bytes, room: int) -> bytes:
        try:  # max_length: what does not fit stays compressed (the read stops there anyway)
            return inflater.decompress(chunk, max(room, 1))
        except zlib.error as err:
            raise httpx.DecodingError(f"bad {codings[0]} body: {err}") from err

    return decode


async def read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    """At most `cap` bytes of the decoded body, and whether there was more."""
    decode = decoder(response.headers.get("content-encoding", ""))
    buf = bytearray()
    async for chunk in response.aiter_raw():
        buf += decode(chunk, cap + 1 - len(buf))
        if len(buf) > cap:
            return bytes(buf[:cap]), True
    return bytes(buf), False


async def _hop(target: Target, *, timeout: float, cap: int) -> Fetched | str:
    """One request on its own connection (never shared between hosts); a redirect gives its Location."""
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        response = await client.send(pinned_request(client, target, HEADERS), stream=True)
        try:
            location = response.headers.get("location")
            if response.status_code in REDIRECTS and location:
                return str(target.url.join(location))
            body, truncated = await read_capped(response, cap)
        finally:
            await response.aclose()
    headers = {k: v for k, v in response.headers.items() if k.lower() in KEPT_HEADERS}
    return Fetched(url=str(target.url), status=response.status_code, headers=headers, body=body, truncated=truncated)


async def fetch(url: str, settings: Settings, *, timeout: float) -> Fetched:
    """GET `url`; raises Blocked, Unresolvable, TooManyRedirects, TimeoutError or httpx.HTTPError."""
    web = settings.tools.web
    current = url
    async with asyncio.timeout(timeout):
        for _ in range(MAX_REDIRECTS + 1):
            target = await check_url(current, web.allow_hosts)
            result = await _hop(target, timeout=timeout, cap=web.max_response_bytes)
            if isinstance(result, Fetched):
                return result
            current = result
    raise TooManyRedirects(f"more than {MAX_REDIRECTS} redirects (last to {current})")


async def fetch_result(url: str, settings: Settings, *, timeout: float) -> Fetched | ToolResult:
    """`fetch`, with every failure turned into the ToolResult the model reads."""
    try:
        return await fetch(url, settings, timeout=timeout)
    except Blocked as err:
        return ToolResult.fail(ErrorCode.PERMISSION_DENIED, f"refused: {err}")
    except Unresolvable as err:
        return ToolResult.fail(ErrorCode.FAILED, str(err), retryable=True)
    except TooManyRedirects as err:
        return ToolResult.fail(ErrorCode.FAILED, str(err))
    except (TimeoutError, httpx.TimeoutException):
        return ToolResult.fail(ErrorCode.TIMEOUT, f"no complete answer from {url} within {timeout:g} s",
                               retryable=True)
    except httpx.HTTPError as err:
        return ToolResult.fail(ErrorCode.FAILED, f"request to {url} failed: {type(err).__name__}: {err}",
                               retryable=True)
