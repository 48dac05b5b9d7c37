"""Where outgoing webhooks may go: https URLs of public addresses only (docs/security.md, SSRF).

The same rules run twice: when an endpoint is saved (so a bad URL is refused with 422) and at every
attempt on the addresses the host resolves to then, just before connecting to one of them. The
attempt connects to the very address that was checked, so a DNS answer that changes between the check
and the connection (DNS rebinding) cannot point it elsewhere.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

URL_LIMIT = 2000
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Prefixes whose addresses carry an IPv4 address inside (NAT64 well-known and local-use); the
# embedded address is what is really reached, so it is judged instead.
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


class TargetRefused(Exception):
    """A URL or address outgoing webhooks must not reach; the message says why (safe to show)."""


@dataclass(frozen=True)
class Target:
    """A checked URL: what to connect to and how to name the host to it."""

    scheme: str
    host: str  # as written, without brackets: the name for Host, SNI and the certificate
    port: int
    path: str  # path and query, at least "/"

    @property
    def host_header(self) -> str:
        """The Host header: the host as written, with the port only when it is not the scheme's default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def parse_url(url: str, allow_http: bool) -> Target:
    """The URL's parts, or TargetRefused: https (http only when allowed), a host, no user or fragment."""
    if len(url) > URL_LIMIT:
        raise TargetRefused(f"The URL is longer than {URL_LIMIT} characters.")
    if any(ord(char) < 33 or ord(char) == 127 for char in url):
        raise TargetRefused("The URL must not contain spaces or control characters.")
    try:
        parts: SplitResult = urlsplit(url)
        port = parts.port
    except ValueError:
        raise TargetRefused("The URL is not valid.") from None
    scheme = parts.scheme.lower()
    if scheme != "https" and not (scheme == "http" and allow_http):
        raise TargetRefused("The URL must start with https://." if not allow_http else "The URL must be http(s).")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("The URL must not hold a user name or password.")
    if parts.fragment:
        raise TargetRefused("The URL must not have a fragment (#...).")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise TargetRefused("The URL has no host.")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme, host, port or (443 if scheme == "https" else 80), path)


def numeric_host(host: str) -> IPAddress | None:
    """The address a host names by number, in any spelling a resolver accepts, or None for a name.

    Resolvers take `2130706433`, `0x7f.1`, `0177.0.0.1` and `127.1` all as 127.0.0.1 (inet_aton's
    rules), so a host is judged by what inet_aton makes of it, not only by the dotted-quad form.
    """
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if host and all(char in "0123456789abcdefxABCDEFX." for char in host) and host[0].isdigit():
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def refusal(address: IPAddress) -> str | None:
    """Why an address must not be reached (loopback, private, ...), or None when it is public."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour or (address.teredo or (None, None))[1]
        if embedded is None and any(address in network for network in _NAT64):
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            reason = refusal(embedded)
            return f"{reason} (inside the IPv6 address {address})" if reason else None
    for attribute, name in (
        ("is_unspecified", "unspecified"),
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(address, attribute):
            return f"{address} is a {name} address"
    if not address.is_global:  # shared (100.64/10), documentation, benchmarking and other special ranges
        return f"{address} is not a public address"
    return None


def check_address(address: IPAddress, allow_private: bool) -> None:
    """TargetRefused unless the address is public (or private ones are allowed)."""
    if allow_private:
        return
    reason = refusal(address)
    if reason:
        raise TargetRefused(f"The URL's host resolves to a forbidden address: {reason}.")


def resolve(target: Target, allow_private: bool) -> list[IPAddress]:
    """Every address the host resolves to now, each checked; TargetRefused if any is forbidden.

    One forbidden address refuses the whole host: picking the allowed ones out of a mixed answer would
    let an attacker's DNS decide which one a retry uses.
    """
    literal = numeric_host(target.host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            found = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise TargetRefused(f"The host {target.host!r} does not resolve.") from None
        addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in found))
        if not addresses:
            raise TargetRefused(f"The host {target.host!r} does not resolve.")
    for address in addresses:
        check_address(address, allow_private)
    return addresses


def check_url(url: str, allow_http: bool, allow_private: bool) -> Target:
    """A URL an endpoint may be saved with: its form, then every address its host resolves to now."""
    target = parse_url(url, allow_http)
    resolve(target, allow_private)
    return target
