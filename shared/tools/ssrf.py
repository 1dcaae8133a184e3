"""The SSRF guard: which URLs a tool may fetch, and the one address each connection is pinned to.

A URL passes when its scheme is http or https and every address its host resolves to is public
unicast: not loopback, private, link-local, CGNAT (100.64/10), multicast, unique-local (fc00::/7),
unspecified, reserved, documentation, or a cloud metadata endpoint, whether written as a name, as
dotted, decimal, octal or hex IPv4, or as IPv6 that embeds IPv4 (mapped, NAT64, 6to4). The caller
then connects to the checked address itself, so a second DNS answer cannot differ from the first.
Hosts on the operator's allow list (host or host:port) skip the address check.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

import httpx

IPAddress = IPv4Address | IPv6Address
SCHEMES = {"http": 80, "https": 443}
BLOCKED_NAMES = {"localhost", "metadata", "metadata.google.internal", "metadata.goog", "instance-data"}
BLOCKED_SUFFIXES = (".localhost", ".internal")
NUMERIC_V4 = re.compile(r"^[0-9a-fA-FxX.]+$")

V4_BLOCKED: list[tuple[IPv4Network, str]] = [(IPv4Network(net), why) for net, why in (
    ("0.0.0.0/8", "unspecified"), ("10.0.0.0/8", "private"), ("100.64.0.0/10", "CGNAT"),
    ("127.0.0.0/8", "loopback"), ("169.254.0.0/16", "link-local or cloud metadata"),
    ("172.16.0.0/12", "private"), ("192.0.0.0/24", "IETF protocol"), ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay"), ("192.168.0.0/16", "private"), ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"), ("203.0.113.0/24", "documentation"), ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
)]
V6_BLOCKED: list[tuple[IPv6Network, str]] = [(IPv6Network(net), why) for net, why in (
    ("::/96", "unspecified, loopback or IPv4-compatible"), ("64:ff9b:1::/48", "local NAT64"),
    ("100::/64", "discard"), ("2001::/23", "IETF protocol (Teredo, ORCHID)"), ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation"), ("5f00::/16", "segment routing"), ("fc00::/7", "unique-local or cloud metadata"),
    ("fe80::/10", "link-local"), ("fec0::/10", "site-local"), ("ff00::/8", "multicast"),
)]
GLOBAL_V6 = IPv6Network("2000::/3")
NAT64 = IPv6Network("64:ff9b::/96")


class Blocked(ValueError):
    """A URL the guard refuses; the message says why."""


class Unresolvable(OSError):
    """The host has no address (a failure, not a refusal)."""


@dataclass(frozen=True)
class Target:
    """A checked URL and the address to connect to."""

    url: httpx.URL
    host: str  # ASCII (IDNA) host name or IP literal, lower case
    port: int
    address: str
    listed: bool  # on the allow list: the address check was skipped


def embedded_v4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, NAT64, 6to4), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in NAT64:
        return IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def blocked_reason(ip: IPAddress) -> str | None:
    """Why a tool must not connect to `ip`, or None for a public unicast address."""
    if isinstance(ip, IPv6Address):
        v4 = embedded_v4(ip)
        if v4 is not None:
            inner = blocked_reason(v4)
            return f"{inner} (embedded in IPv6)" if inner else None
        for net6, why in V6_BLOCKED:
            if ip in net6:
                return why
        return None if ip in GLOBAL_V6 else "reserved IPv6"
    for net4, why in V4_BLOCKED:
        if ip in net4:
            return why
    return "broadcast" if ip == IPv4Address("255.255.255.255") else None


def ip_literal(host: str) -> IPAddress | None:
    """The address a host written as an IP means, including 2130706433, 0x7f.1 and 0177.0.0.1."""
    try:
        return ip_address(host)
    except ValueError:
        pass
    if NUMERIC_V4.match(host) and any(c.isdigit() for c in host):
        try:
            return IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address of `host` (an IP literal resolves to itself, without DNS)."""
    literal = ip_literal(host)
    if literal is not None:
        return [literal]
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise Unresolvable(f"cannot resolve host '{host}': {err}") from err
    found: list[IPAddress] = []
    for info in infos:
        ip = ip_address(str(info[4][0]).split("%")[0])
        if ip not in found:
            found.append(ip)
    if not found:
        raise Unresolvable(f"host '{host}' has no address")
    return found


def is_listed(host: str, port: int, allow_hosts: Iterable[str]) -> bool:
    names = {host, f"{host}:{port}", f"[{host}]:{port}", f"[{host}]"}
    return any(entry.strip().lower().rstrip(".") in names for entry in allow_hosts)


def parse_url(raw: str) -> tuple[httpx.URL, str, int]:
    """(URL, ASCII host, port) of an http(s) URL; raise Blocked for anything else."""
    try:
        url = httpx.URL(raw)
        host = url.raw_host.decode("ascii").lower().rstrip(".")
    except (httpx.InvalidURL, UnicodeError, TypeError) as err:
        raise Blocked(f"invalid URL: {err}") from err
    if url.scheme not in SCHEMES:
        raise Blocked(f"only http and https URLs can be fetched, not '{url.scheme or raw}'")
    if not host:
        raise Blocked("the URL has no host")
    return url, host, url.port or SCHEMES[url.scheme]


async def check_url(raw: str, allow_hosts: Iterable[str]) -> Target:
    """Parse, resolve and check a URL; raise Blocked (refused) or Unresolvable (no address)."""
    url, host, port = parse_url(raw)
    listed = is_listed(host, port, allow_hosts)
    if not listed and (host in BLOCKED_NAMES or host.endswith(BLOCKED_SUFFIXES)):
        raise Blocked(f"'{host}' is a local or cloud metadata host name")
    addresses = await resolve(host, port)
    if not listed:
        for ip in addresses:
            if (why := blocked_reason(ip)) is not None:
                raise Blocked(f"'{host}' resolves to {ip} ({why}); only public addresses can be fetched")
    return Target(url=url, host=host, port=port, address=str(addresses[0]), listed=listed)


def pinned_request(client: httpx.AsyncClient, target: Target, headers: dict[str, str]) -> httpx.Request:
    """A GET to the checked address, with the Host header, TLS SNI and certificate check of the name."""
    extensions = {}
    if target.url.scheme == "https" and ip_literal(target.host) is None:
        extensions["sni_hostname"] = target.host  # httpcore verifies the certificate against this name
    host_header = target.url.netloc.decode("ascii")
    return client.build_request("GET", target.url.copy_with(host=target.address),
                                headers={**headers, "Host": host_header}, extensions=extensions)
