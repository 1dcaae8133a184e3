"""The SSRF guard: every private, local or metadata target is refused in whatever form it is
written; a listed loopback server is reachable; redirects are re-checked; the connection goes to
the checked address; responses are capped."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import IPv4Address, IPv6Address, IPv6Network

import httpx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from shared.aio import run_sync
from shared.tools import ssrf
from shared.tools.base import ErrorCode
from shared.tools.registry import ToolRegistry
from shared.tools.ssrf import V4_BLOCKED, V6_BLOCKED, Blocked, Target, blocked_reason, check_url, pinned_request
from tests.fakes.web import FakeWeb
from tests.shared.tools.conftest import call


def refused(url: str) -> bool:
    try:
        run_sync(check_url(url, []))
    except Blocked:
        return True
    return False


private_v4 = st.sampled_from([net for net, _ in V4_BLOCKED] + [IPv4Address("255.255.255.255")]).flatmap(
    lambda net: st.just(net) if isinstance(net, IPv4Address)
    else st.integers(int(net.network_address), int(net.broadcast_address)).map(IPv4Address))
private_v6 = st.sampled_from([net for net, _ in V6_BLOCKED]).flatmap(
    lambda net: st.integers(int(net.network_address), int(net.broadcast_address)).map(IPv6Address))


def v4_forms(ip: IPv4Address) -> list[str]:
    """The ways a URL host can spell an IPv4 address (inet_aton's and IPv6's)."""
    a, b, c, d = ip.packed
    n = int(ip)
    return [str(ip), str(n), f"0x{n:08x}", f"0{a:o}.0{b:o}.0{c:o}.0{d:o}", f"0x{a:x}.0x{b:x}.0x{c:x}.0x{d:x}",
            f"{a}.{b}.{(c << 8) | d}", f"{a}.{(b << 16) | (c << 8) | d}",
            f"[::ffff:{ip}]", f"[::ffff:{n >> 16:x}:{n & 0xFFFF:x}]", f"[64:ff9b::{ip}]",
            f"[2002:{n >> 16:x}:{n & 0xFFFF:x}::1]"]


def urls(host: str) -> list[str]:
    return [f"http://{host}/", f"https://{host}:8443/a?b=c", f"http://user:pw@{host}:80/latest/meta-data/"]


@given(ip=private_v4)
def test_private_ipv4_is_refused_in_every_form(ip: IPv4Address) -> None:
    for form in v4_forms(ip):
        for url in urls(form):
            assert refused(url), url


@given(ip=private_v6)
def test_private_ipv6_is_refused(ip: IPv6Address) -> None:
    assume(ip.ipv4_mapped is None)
    for url in urls(f"[{ip}]"):
        assert refused(url), url


PUBLIC_V4 = [("11.0.0.0", "99.255.255.255"), ("128.0.0.0", "168.255.255.255"), ("173.0.0.0", "191.255.255.255"),
             ("200.0.0.0", "202.255.255.255")]
public_v4 = st.one_of(*(st.integers(int(IPv4Address(lo)), int(IPv4Address(hi))) for lo, hi in PUBLIC_V4))


@given(n=public_v4)
def test_public_ipv4_passes_and_is_pinned(n: int) -> None:
    ip = IPv4Address(n)
    assert blocked_reason(ip) is None
    target = run_sync(check_url(f"http://{ip}:8080/x", []))
    assert target.address == str(ip) and not target.listed


@given(n=st.integers(int(IPv6Network("2000::/3").network_address), int(IPv6Network("2000::/3").broadcast_address)))
def test_global_ipv6_passes_unless_it_embeds_a_private_ipv4(n: int) -> None:
    ip = IPv6Address(n)
    blocked = any(ip in net for net, _ in V6_BLOCKED) or (ip.sixtofour is not None and
                                                           blocked_reason(ip.sixtofour) is not None)
    assert refused(f"http://[{ip}]/") == blocked


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/latest/", "http://metadata.google.internal/",
    "http://metadata/computeMetadata/v1/", "http://localhost:6379/", "http://app.localhost/", "http://0/",
    "http://[::]/", "http://[::1]/", "http://100.100.100.200/", "file:///etc/passwd", "ftp://example.com/",
    "gopher://127.0.0.1:6379/_INFO", "http:///nohost", "http://0177.0.0.1/", "javascript:alert(1)",
])
def test_known_bad_targets_are_refused(url: str) -> None:
    assert refused(url)


def test_listed_loopback_server_is_allowed(registry: Callable[..., ToolRegistry], web: FakeWeb) -> None:
    for entry in (web.host, "127.0.0.1"):
        result = call(registry(web={"allow_hosts": [entry]}), "http_get", {"url": f"{web.url}/json"})
        assert result.ok and result.output["status"] == 200 and '"otter"' in result.output["body"]
    unlisted = call(registry(web={"allow_hosts": ["127.0.0.1:1"]}), "http_get", {"url": f"{web.url}/json"})
    assert unlisted.status == "REJECTED" and "loopback" in unlisted.message


def test_redirects_are_rechecked(registry: Callable[..., ToolRegistry], web: FakeWeb) -> None:
    reg = registry(web={"allow_hosts": [web.host]})

    def via(to: str, code: int = 302) -> object:
        return call(reg, "http_get", {"url": str(httpx.URL(f"{web.url}/redirect", params={"to": to, "code": code}))})

    followed = via(f"{web.url}/json", 307)
    assert followed.ok and followed.output["url"] == f"{web.url}/json"  # type: ignore[attr-defined]
    assert via("/json").ok  # type: ignore[attr-defined]
    for private in ("http://127.0.0.1:1/", "http://10.0.0.1/admin", "http://[::1]:8080/", "file:///etc/passwd",
                    "http://169.254.169.254/latest/meta-data/"):
        assert via(private).status == "REJECTED", private  # type: ignore[attr-defined]
    looping = call(reg, "http_get", {"url": f"{web.url}/loop"})
    assert looping.error == ErrorCode.FAILED and "redirects" in looping.message


def test_connection_goes_to_the_checked_address(registry: Callable[..., ToolRegistry], web: FakeWeb,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """'pinned.test' exists in no DNS: the fetch works only because it connects to the address checked."""
    async def resolve(host: str, port: int) -> list[IPv4Address]:
        return [IPv4Address("127.0.0.1")]

    monkeypatch.setattr(ssrf, "resolve", resolve)
    reg = registry(web={"allow_hosts": [f"pinned.test:{web.server.port}"]})
    result = call(reg, "http_get", {"url": f"http://pinned.test:{web.server.port}/host"})
    assert result.ok and f'"host":"pinned.test:{web.server.port}"' in result.output["body"]


def test_https_keeps_the_name_for_sni_and_the_certificate() -> None:
    target = Target(url=httpx.URL("https://example.com:8443/x?y=1"), host="example.com", port=8443,
                    address="93.184.215.14", listed=False)
    request = pinned_request(httpx.AsyncClient(), target, {})
    assert request.url.host == "93.184.215.14" and request.url.port == 8443 and request.url.path == "/x"
    assert request.headers["host"] == "example.com:8443"
    assert request.extensions["sni_hostname"] == "example.com"
    v6 = Target(url=httpx.URL("http://example.com/"), host="example.com", port=80, address="2606:2800::1",
                listed=False)
    assert pinned_request(httpx.AsyncClient(), v6, {}).url.netloc == b"[2606:2800::1]"


def test_response_size_is_capped(registry: Callable[..., ToolRegistry], web: FakeWeb) -> None:
    reg = registry(web={"allow_hosts": [web.host], "max_response_bytes": 100_000})
    result = call(reg, "http_get", {"url": f"{web.url}/big?chunks=64"})
    assert result.ok and result.output["truncated"] is True
    assert len(result.output["body"]) <= 100_000


def test_slow_server_times_out(registry: Callable[..., ToolRegistry], web: FakeWeb) -> None:
    reg = registry(web={"allow_hosts": [web.host], "http_timeout": 0.3})
    result = call(reg, "http_get", {"url": f"{web.url}/slow?seconds=5"})
    assert result.error == ErrorCode.TIMEOUT and result.retryable
