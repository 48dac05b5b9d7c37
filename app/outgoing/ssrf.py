"""Where outgoing webhooks may go: https URLs of public addresses only (docs/security.md, SSRF).

The same rules run twice: when an endpoint is saved (so a bad URL is refused with 422) and at every
attempt on the addresses the host resolves to then, just before connecting to one of them. The
attempt connects to the very address that was checked, so a DNS answer that changes between the check
and the connection (DNS rebinding) cannot point it elsewhere.

Which addresses are public is written out here (the registered special-purpose ranges) instead of
taken from `ipaddress.is_global`, whose tables change with the Python release: 3.11 takes 192.0.0.8 and
the site-local fec0::/10 for global, and the AMT anycast 2001:3::/32 for private.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit

import idna

URL_LIMIT = 2000
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

ALLOW_PRIVATE_HINT = (
    "Only public addresses are allowed; WEBHOOK_OUT_ALLOW_PRIVATE=true allows the others "
    "(for development on one machine)."
)


def _networks(*cidrs: str) -> tuple:
    return tuple(ipaddress.ip_network(cidr) for cidr in cidrs)


# IPv4 ranges that are not globally routable unicast.
_IPV4_NOT_GLOBAL = _networks(
    "0.0.0.0/8",  # "this network": 0.0.0.0 reaches the local host
    "10.0.0.0/8",  # private
    "100.64.0.0/10",  # shared address space (carrier-grade NAT)
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local, cloud metadata services among them
    "172.16.0.0/12",  # private
    "192.0.0.0/24",  # IETF protocol assignments (but the two anycast addresses below)
    "192.0.2.0/24",  # documentation
    "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
    "192.168.0.0/16",  # private
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation
    "203.0.113.0/24",  # documentation
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the limited broadcast address
)
_IPV4_GLOBAL_EXCEPTIONS = _networks("192.0.0.9/32", "192.0.0.10/32")  # PCP and TURN anycast

# IPv6: global unicast is 2000::/3; everything else (loopback, unique-local fc00::/7, link-local, the
# site-local fec0::/10, multicast, the local-use NAT64 prefix 64:ff9b:1::/48 ...) is refused. Inside it:
_IPV6_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
_IPV6_NOT_GLOBAL = _networks(
    "2001::/23",  # IETF protocol assignments, Teredo (2001::/32) among them (but the exceptions below)
    "2001:db8::/32",  # documentation
    "3fff::/20",  # documentation
    "5f00::/16",  # SRv6 segment identifiers
)
_IPV6_GLOBAL_EXCEPTIONS = _networks(
    "2001:1::1/128",  # port control protocol anycast
    "2001:1::2/128",  # TURN anycast
    "2001:1::3/128",  # DNS-SD service registration anycast
    "2001:3::/32",  # AMT
    "2001:4:112::/48",  # AS112
    "2001:20::/28",  # ORCHIDv2
    "2001:30::/28",  # drone remote ID
)
# IPv6 forms whose packets really go to the IPv4 address inside: that address is judged instead.
_IPV4_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # NAT64's well-known prefix
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")

# What the URL standard refuses in a host name once it is decoded (its "forbidden domain code points").
_FORBIDDEN_IN_HOST = set(" #%/:<>?@[\\]^|") | {chr(n) for n in range(32)} | {chr(127)}


class TargetRefused(Exception):
    """A URL or address outgoing webhooks must not reach; the message says why (safe to show).

    `detail` may say more (what a name resolved to), for the operator's log only.
    """

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail or message


@dataclass(frozen=True)
class Target:
    """A checked URL: what to connect to and how to name the host to it."""

    scheme: str
    host: str  # ASCII (an IDN in its punycode form), without brackets: for DNS, Host, SNI and the certificate
    port: int
    path: str  # path and query, at least "/"

    @property
    def host_header(self) -> str:
        """The Host header: the host, with the port only when it is not the scheme's default."""
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
        if allow_http:
            raise TargetRefused("The URL must start with https:// or http://.")
        raise TargetRefused("The URL must start with https:// (WEBHOOK_OUT_ALLOW_HTTP=true also allows http://).")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("The URL must not hold a user name or password.")
    if parts.fragment:
        raise TargetRefused("The URL must not have a fragment (#...).")
    host = ascii_host(parts.hostname or "")
    if not host:
        raise TargetRefused("The URL has no host.")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme, host, port or (443 if scheme == "https" else 80), path)


def ascii_host(host: str) -> str:
    """The host as DNS, TLS and HTTP name it: an internationalised name in its IDNA (punycode) form.

    As the WHATWG URL standard processes a host: percent-decoded, then mapped by UTS #46 (not
    transitional: `ß` stays `ß`, so `faß.example` is `xn--fa-hia.example`, not `fass.example`). The
    mapping also turns full-width letters, digits and dots into ASCII, so `１２７．０．０．１` is judged
    as the 127.0.0.1 it is. An IPv6 literal (urlsplit took its brackets off) is left as it is.
    """
    if ":" in host:
        return host
    if "%" in host:
        host = unquote(host)
    if not host.isascii():
        try:
            host = idna.encode(host, uts46=True, transitional=False).decode("ascii")
        except idna.IDNAError as error:
            raise TargetRefused(
                f"The URL's host is not a valid internationalised domain name (IDNA): {error}."
            ) from None
    if any(char in _FORBIDDEN_IN_HOST for char in host):
        raise TargetRefused("The URL's host holds a character a host name cannot have.")
    return host.lower().rstrip(".")


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


def is_public(address: IPAddress) -> bool:
    """Whether the address is globally routable unicast (the rules above; IPv4 inside IPv6 judged as IPv4)."""
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        return is_public(embedded)
    if isinstance(address, ipaddress.IPv4Address):
        not_global, exceptions = _IPV4_NOT_GLOBAL, _IPV4_GLOBAL_EXCEPTIONS
    else:
        if address not in _IPV6_GLOBAL_UNICAST:
            return False
        not_global, exceptions = _IPV6_NOT_GLOBAL, _IPV6_GLOBAL_EXCEPTIONS
    return not any(address in network for network in not_global) or any(address in network for network in exceptions)


def refusal(address: IPAddress) -> str | None:
    """Why an address must not be reached (loopback, private, ...), or None when it is public."""
    if is_public(address):
        return None
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        return f"{refusal(embedded)} (inside the IPv6 address {address})"
    return f"{address} is {_kind(address)}"


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address in _IPV4_MAPPED or address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _SIX_TO_FOUR:
        return address.sixtofour
    return None


def _kind(address: IPAddress) -> str:
    """A name for a non-public address's kind, for a refusal's message."""
    for attribute, name in (
        ("is_unspecified", "the unspecified address"),
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_multicast", "a multicast address"),
        ("is_site_local", "a site-local address"),
        ("is_private", "a private address"),
        ("is_reserved", "a reserved address"),
    ):
        if getattr(address, attribute, False):
            return name
    return "not a globally routable unicast address"


def resolve(target: Target, allow_private: bool) -> list[IPAddress]:
    """Every address the host resolves to now, each checked; TargetRefused if any is forbidden.

    One forbidden address refuses the whole host: picking the allowed ones out of a mixed answer would
    let an attacker's DNS decide which one a retry uses. A refusal names the address only when the URL
    itself holds it: what a name resolves to is the operator's internal DNS, not for the caller to learn.
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
    if allow_private:
        return addresses
    for address in addresses:
        reason = refusal(address)
        if reason is None:
            continue
        if literal is not None:
            raise TargetRefused(f"The URL's host is a forbidden address: {reason}. {ALLOW_PRIVATE_HINT}")
        raise TargetRefused(
            f"The URL's host name resolves to a forbidden address (one that is not public). {ALLOW_PRIVATE_HINT}",
            detail=f"{target.host} resolves to a forbidden address: {reason}",
        )
    return addresses


def check_url(url: str, allow_http: bool, allow_private: bool) -> Target:
    """A URL an endpoint may be saved with: its form, then every address its host resolves to now."""
    target = parse_url(url, allow_http)
    resolve(target, allow_private)
    return target
