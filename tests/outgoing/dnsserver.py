"""A real DNS server for tests: UDP on 127.0.0.1, answering A queries for the names it is given.

The machine's own resolver knows only /etc/hosts and an upstream server, so a test that needs a name
(an internationalised one, say) to resolve to loopback points a process's resolver here instead: gevent's
c-ares resolver (`resolver_env()`), which still reads /etc/hosts first. Every other name is answered
NXDOMAIN, so no lookup leaves the machine. `queries` records every question asked, as it arrived.
"""

from __future__ import annotations

import socket
import struct
import threading

A, AAAA = 1, 28
NXDOMAIN = 3


class DnsServer:
    """Answers `records` (name -> IPv4 address); every other name does not exist."""

    def __init__(self, records: dict[str, str]):
        self.records = {name.lower(): address for name, address in records.items()}
        self.queries: list[tuple[str, int]] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def start(self) -> DnsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.sock.close()

    def resolver_env(self) -> dict[str, str]:
        """Environment that makes a gevent process resolve through this server (TCP too, for a retry)."""
        return {
            "GEVENT_RESOLVER": "ares",
            "GEVENT_RESOLVER_NAMESERVERS": "127.0.0.1",
            "GEVENTARES_UDP_PORT": str(self.port),
            "GEVENTARES_TCP_PORT": str(self.port),
        }

    def asked(self, name: str) -> bool:
        return any(asked.lower() == name.lower() for asked, _ in self.queries)

    def _serve(self) -> None:
        while True:
            try:
                query, peer = self.sock.recvfrom(4096)
            except OSError:
                return  # closed
            try:
                answer = self._answer(query)
            except (IndexError, struct.error):
                continue  # not a query this server understands
            self.sock.sendto(answer, peer)

    def _answer(self, query: bytes) -> bytes:
        (ident,) = struct.unpack("!H", query[:2])
        at, labels = 12, []
        while query[at]:
            # Latin-1 keeps every byte as it came: a name sent unencoded shows as non-ASCII.
            labels.append(query[at + 1 : at + 1 + query[at]].decode("latin-1"))
            at += 1 + query[at]
        (qtype,) = struct.unpack("!H", query[at + 1 : at + 3])
        question = query[12 : at + 5]
        name = ".".join(labels)
        self.queries.append((name, qtype))
        address = self.records.get(name.lower())
        record = b""
        if address and qtype == A:
            # The name as a pointer to the question's, type A, class IN, a TTL of 60 s, four bytes.
            record = b"\xc0\x0c" + struct.pack("!HHIH", A, 1, 60, 4) + socket.inet_aton(address)
        code = 0 if address else NXDOMAIN  # a known name without an AAAA record: no error, no answer
        # A response to a recursive query, recursion available; one question, one answer or none.
        header = struct.pack("!HHHHHH", ident, 0x8180 | code, 1, 1 if record else 0, 0, 0)
        return header + question + record
