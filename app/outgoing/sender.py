"""One attempt: POST the signed message to the endpoint, within bounded time, reading at most 1 KiB back.

The same address-checked HTTP serves the service's other calls to addresses it was given: a trusted
issuer's JWKS (GET) and a namespace's subscribe proxy (POST), each with its own time-out and read limit
(`Sender.request`).

urllib3 does the HTTP; this module decides where it may connect. The host is resolved here, every
address is checked (app/outgoing/ssrf.py), and urllib3 is told to connect to the checked address while
naming the original host in `Host`, in TLS's SNI and in the certificate check (its documented
`server_hostname` / `assert_hostname` pool options). That name is the ASCII one ssrf.py made: an
internationalised host goes to DNS, `Host` and SNI in its IDNA (punycode) form, as a browser sends it.
Redirects are never followed: a 3xx is a failure.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gevent

from .ssrf import TargetRefused, parse_url, resolve

if TYPE_CHECKING:
    import urllib3

# urllib3 is imported by the first request, not with this module: most processes never make one, and
# its import costs tens of milliseconds in every worker.

log = logging.getLogger(__name__)

RESPONSE_READ_LIMIT = 1024  # of a receiver's answer only the status counts; a few bytes are read, no more
USER_AGENT = "auth-rt-webhooks/1"


@dataclass(frozen=True)
class Reply:
    """What a request came to, and the first `read_limit` bytes of the answer's body."""

    result: AttemptResult
    body: bytes = b""


@dataclass(frozen=True)
class AttemptResult:
    """What one attempt came to (docs/api.md, the attempts of M)."""

    succeeded: bool
    status_code: int | None
    duration_ms: int
    error: str | None
    kind: str  # success | http_error | redirect | timeout | refused | connection_error

    def as_record(self, at: float) -> dict:
        """The attempt as stored with its message."""
        return {
            "at": round(at, 3),
            "status_code": self.status_code,
            "duration_ms": self.duration_ms,
            "error": self.error,
        }


class Sender:
    """Keep-alive connections per endpoint, shared by that endpoint's attempts in this process."""

    def __init__(self, settings, pool_size: int, purpose: str = "outgoing webhooks: endpoint"):
        self.settings = settings  # OutgoingWebhooks
        self.pool_size = pool_size
        self.purpose = purpose  # what the log calls a request's key (an endpoint, an issuer, a namespace)
        # Per endpoint, so endpoints on one host neither share nor crowd out each other's connections;
        # inside, one pool per checked address and host name. As many kept connections as the endpoint
        # may have attempts in flight; the bound itself is enforced before an attempt starts.
        self.managers: dict[str, urllib3.PoolManager] = {}

    def forget(self, endpoint_ids: set[str]) -> None:
        """Close the connections of endpoints that are gone."""
        for endpoint_id in set(self.managers) - endpoint_ids:
            self.managers.pop(endpoint_id).clear()

    def send(self, endpoint_id: str, url: str, body: bytes, headers: dict[str, str]) -> AttemptResult:
        """POST once; every failure (refusal, time-out, redirect, non-2xx) is a result, never an exception."""
        return self.request(endpoint_id, "POST", url, body=body, headers=headers).result

    def request(
        self,
        key: str,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        read_limit: int = RESPONSE_READ_LIMIT,
    ) -> Reply:
        """One request to a URL checked as outgoing webhooks are, over `key`'s kept connections; its result
        and at most `read_limit` bytes of the answer. Every failure is a result, never an exception."""
        import urllib3

        started = time.monotonic()
        timeout = self.settings.timeout_seconds if timeout is None else timeout
        manager = self.managers.get(key)
        if manager is None:
            manager = self.managers[key] = urllib3.PoolManager(
                num_pools=8, maxsize=self.pool_size, block=False, retries=False
            )
        try:
            # The whole attempt, resolving and reading included, ends at the time-out: a receiver that
            # trickles its answer a byte at a time cannot hold an attempt longer.
            with gevent.Timeout(timeout):
                return self._request(key, manager, method, url, body, headers or {}, timeout, read_limit, started)
        except gevent.Timeout:
            return Reply(self._result(False, None, started, f"no answer within {timeout:g} s", "timeout"))

    def _request(
        self,
        key: str,
        manager,
        method: str,
        url: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout: float,
        read_limit: int,
        started: float,
    ) -> Reply:
        import urllib3
        from urllib3.exceptions import HTTPError, SSLError

        try:
            target = parse_url(url, self.settings.allow_http)
            addresses = resolve(target, self.settings.allow_private)
        except TargetRefused as refusal:
            # The attempt's error (shown to the endpoint's managers) never says what a name resolved
            # to; the operator's log does.
            log.warning("%s %s: attempt refused: %s", self.purpose, key, refusal.detail)
            return Reply(self._result(False, None, started, str(refusal), "refused"))
        connect = min(self.settings.connect_timeout_seconds, timeout)
        error = "no address to connect to"
        for address in addresses:
            pool_kwargs = {}
            if target.scheme == "https":
                pool_kwargs = {"server_hostname": target.host, "assert_hostname": target.host}
            pool = manager.connection_from_host(str(address), target.port, target.scheme, pool_kwargs)
            try:
                response = pool.urlopen(
                    method,
                    target.path,
                    body=body,
                    headers={**headers, "Host": target.host_header, "User-Agent": USER_AGENT},
                    redirect=False,
                    retries=False,
                    assert_same_host=False,
                    preload_content=False,
                    decode_content=False,
                    timeout=urllib3.Timeout(connect=connect, read=timeout),
                )
            except urllib3.exceptions.NewConnectionError as failure:  # (a subclass of the time-out below)
                error = f"could not connect: {_reason(failure)}"
                continue  # another address of the host may answer
            except urllib3.exceptions.ConnectTimeoutError:
                error = f"could not connect within {connect:g} s"
                continue
            except urllib3.exceptions.ReadTimeoutError:
                return Reply(self._result(False, None, started, f"no answer within {timeout:g} s", "timeout"))
            except SSLError as failure:
                return Reply(self._result(False, None, started, f"TLS failed: {_reason(failure)}", "connection_error"))
            except (HTTPError, OSError) as failure:
                failed = f"connection failed: {_reason(failure)}"
                return Reply(self._result(False, None, started, failed, "connection_error"))
            return self._answer(response, started, read_limit)
        kind = "timeout" if "within" in error else "connection_error"
        return Reply(self._result(False, None, started, error, kind))

    def _answer(self, response, started: float, read_limit: int) -> Reply:
        from urllib3.exceptions import HTTPError

        status, body = response.status, b""
        try:
            body = response.read(read_limit, decode_content=False)
        except (HTTPError, OSError):
            pass  # the status is what counts; a broken body does not change it
        finally:
            if response.length_remaining == 0:
                response.release_conn()  # fully read: the connection can serve the next attempt
            else:
                response.close()  # more than we read (or unknown): not reusable
                response.release_conn()
        if 200 <= status < 300:
            return Reply(self._result(True, status, started, None, "success"), body)
        if 300 <= status < 400:
            return Reply(self._result(False, status, started, f"redirect ({status}) not followed", "redirect"))
        return Reply(self._result(False, status, started, f"HTTP {status}", "http_error"), body)

    @staticmethod
    def _result(succeeded: bool, status: int | None, started: float, error: str | None, kind: str) -> AttemptResult:
        return AttemptResult(succeeded, status, int((time.monotonic() - started) * 1000), error, kind)


def _reason(failure: Exception) -> str:
    """A short reason in words ("connection refused"), without the URL (it may hold a token in its query)."""
    cause = _innermost(failure)
    text = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
    for wrapper in _WRAPPERS:  # "[Errno 111] ", "[SSL: WRONG_VERSION_NUMBER] ", " (_ssl.c:1006)" and the like
        text = wrapper.sub("", text).strip()
    if text[1:2].islower():  # "Connection refused" -> "connection refused", but "TLS ..." stays
        text = text[:1].lower() + text[1:]
    return text[:200]


# What Python, OpenSSL and urllib3 wrap around the reason itself.
_WRAPPERS = (
    re.compile(r"^<[^>]*>: "),
    re.compile(r"^Failed to establish a new connection: "),
    re.compile(r"^\[Errno -?\d+\] "),
    re.compile(r"^\[SSL(: [A-Z0-9_]+)?\] "),
    re.compile(r" \(_ssl\.c:\d+\)$"),
)


def _innermost(failure: BaseException) -> BaseException:
    """The exception at the bottom of urllib3's wrapping (its `reason`, cause, or an exception among its args)."""
    seen = set()
    while id(failure) not in seen:
        seen.add(id(failure))
        inner = getattr(failure, "reason", None)
        if not isinstance(inner, BaseException):
            args = [arg for arg in failure.args if isinstance(arg, BaseException)]
            inner = failure.__cause__ or (args[-1] if args else None)
        if inner is None:
            break
        failure = inner
    return failure
