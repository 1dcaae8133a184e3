"""`fetch` against a loopback server that answers compressed: the size cap holds after decompression,
and encodings that cannot be decoded with a bound are refused."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from shared.aio import run_sync
from shared.settings import Settings, load_settings
from shared.tools.base import ErrorCode, ToolResult
from shared.tools.fetch import Fetched, fetch_result
from tests.fakes.server import ThreadServer

CAP = 1_000_000
BOMB_BYTES = 64 * CAP  # zeros: about 64 KB on the wire
PAGE = b"<html><body>" + b"otters " * 1000 + b"</body></html>"


def _gzip_zeros(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    return b"".join(packer.compress(block) for _ in range(size >> 20)) + packer.flush()


BOMB = _gzip_zeros(BOMB_BYTES)
ANSWERS: dict[str, tuple[bytes, str]] = {
    "bomb": (BOMB, "gzip"),
    "stacked": (gzip.compress(BOMB), "gzip, gzip"),
    "page": (gzip.compress(PAGE), "gzip"),
    "deflated": (zlib.compress(PAGE), "deflate"),
    "brotli": (b"\x1b\x03\x00\xf8", "br"),
    "corrupt": (b"not gzip at all", "gzip"),
}


async def answer(request: Request) -> Response:
    body, encoding = ANSWERS[request.path_params["name"]]
    return Response(body, media_type="text/html", headers={"Content-Encoding": encoding})


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = ThreadServer(Starlette(routes=[Route("/{name}", answer)])).start()
    yield server.url
    server.stop()


def settings(url: str) -> Settings:
    return load_settings(tools={"web": {"allow_hosts": [url.removeprefix("http://")], "max_response_bytes": CAP}})


def get(site: str, name: str) -> Fetched | ToolResult:
    return run_sync(fetch_result(f"{site}/{name}", settings(site), timeout=30))


def test_a_gzip_bomb_is_cut_at_the_cap_without_inflating_it(site: str) -> None:
    get(site, "page")  # first-use costs (imports, the TLS context) are not what is measured
    tracemalloc.start()
    try:
        page = get(site, "bomb")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(page, Fetched) and page.truncated and page.body == bytes(CAP)
    assert peak < 8 * CAP  # what was held, not only what was kept: the whole answer is 64 * CAP


def test_compressed_pages_still_decode(site: str) -> None:
    for name in ("page", "deflated"):
        page = get(site, name)
        assert isinstance(page, Fetched) and page.body == PAGE and not page.truncated, name


@pytest.mark.parametrize("name", ["stacked", "brotli", "corrupt"])
def test_encodings_that_cannot_be_bounded_are_refused(site: str, name: str) -> None:
    result = get(site, name)
    assert isinstance(result, ToolResult) and result.error == ErrorCode.FAILED and "DecodingError" in result.message


def page(body: bytes, content_type: str = "text/html") -> Fetched:
    return Fetched(url="http://x/", status=200, headers={"content-type": content_type}, body=body, truncated=False)


def test_a_page_is_read_in_the_charset_it_declares() -> None:
    """A page that names its charset only in a meta tag was read as UTF-8: "Caf\ufffd na\ufffdve"."""
    latin = b"<html><head><meta charset='iso-8859-1'><title>Caf\xe9</title></head><body>na\xefve \x96 ok</body>"
    assert "<title>Caf\u00e9</title></head><body>na\u00efve \u2013 ok" in page(latin).text()  # 0x96: as browsers
    legacy = '<meta http-equiv="Content-Type" content="text/html; charset=Shift_JIS"><p>日本語</p>'
    assert "日本語" in page(legacy.encode("shift_jis")).text()
    assert page("<p>naïve</p>".encode("cp1252"), "text/html; charset=windows-1252").text() == "<p>naïve</p>"
    assert page("\ufeff<p>é</p>".encode()).text() == "<p>é</p>"  # a byte order mark is not text
    assert page(b"<meta charset='no-such-codec'><p>ok</p>").text().endswith("<p>ok</p>")
    assert page("<meta charset='x'>é".encode(), "text/plain").text() == "<meta charset='x'>é"  # HTML only
