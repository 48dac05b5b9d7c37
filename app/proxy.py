"""Forwarded headers believed only from a trusted proxy: the peers in FORWARDED_ALLOW_IPS.

Without this check, a client that reaches gunicorn directly could name any address, scheme or host in
X-Forwarded-*: a fresh address per request escapes every per-address rate limit and is recorded as
the session's address. From any other peer those headers are ignored and the peer is the client.
"""

from __future__ import annotations

import functools
import ipaddress

from werkzeug.middleware.proxy_fix import ProxyFix


@functools.lru_cache(maxsize=4096)
def peer_is_trusted(remote_addr: str | None, trusted: tuple) -> bool:
    """Whether the direct peer may speak for the client; a Unix-socket peer (no address) is local. Remembered per
    peer and list: parsing the address was a visible part of a small request's cost."""
    if not remote_addr:
        return True  # as gunicorn treats a Unix socket: only a local proxy can reach it
    try:
        address = ipaddress.ip_address(remote_addr.split("%", 1)[0])
    except ValueError:
        return False
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in trusted)


class TrustedProxyFix:
    """ProxyFix with PROXY_HOPS hops, applied only to requests whose peer is a trusted proxy."""

    def __init__(self, app, hops: int, trusted: tuple):
        self.app = app
        self.trusted = trusted
        # X-Forwarded-Host carries the port (nginx sends $http_host), so X-Forwarded-Port is not trusted.
        self.proxied = ProxyFix(app, x_for=hops, x_proto=hops, x_host=hops)

    def __call__(self, environ, start_response):
        """WSGI entry: through ProxyFix for a trusted peer, straight to the app for anyone else."""
        if peer_is_trusted(environ.get("REMOTE_ADDR"), self.trusted):
            return self.proxied(environ, start_response)
        return self.app(environ, start_response)
