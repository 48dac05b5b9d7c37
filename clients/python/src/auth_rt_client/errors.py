"""The exceptions the client raises: one base class, and one type per kind of failure."""

from __future__ import annotations

import email.utils
import time

import httpx


class AuthRtError(Exception):
    """Base class of every exception this package raises."""


class ApiError(AuthRtError):
    """The service answered with an error: `{"error": {"code", "message"}}` and an HTTP status.

    `code` is stable and meant for programs (`unauthorized`, `forbidden`, `validation_failed`, ...);
    `message` is meant for people. `retry_after` is the `Retry-After` header in seconds, when sent
    (429 and 503 answers carry it). `request_id` is the `X-Request-ID` to quote in a report.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        retry_after: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.request_id = request_id

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        """The error an answer carries; a body that is not the service's error shape still gives one.

        The token endpoint answers in OAuth's shape (RFC 6749, `{"error": "<code>", "error_description"}`):
        its `error` is the code and its description the message.
        """
        code, message = f"http_{response.status_code}", response.reason_phrase or "unexpected answer"
        try:
            body = response.json()
            error = body["error"]
            if isinstance(error, str):
                code, message = error, str(body.get("error_description") or error)
            else:
                code, message = str(error["code"]), str(error["message"])
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # e.g. a proxy's HTML page: keep the status-based code
        return cls(
            response.status_code,
            code,
            message,
            retry_after=parse_retry_after(response.headers.get("Retry-After")),
            request_id=response.headers.get("X-Request-ID"),
        )

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later unchanged (rate limited, or the service unavailable)."""
        return self.status in (429, 500, 502, 503, 504)


class MfaRequired(ApiError):
    """The password was right and the account has a second factor (401 `mfa_required`).

    Finish the login with `Client.login_mfa(error.mfa_token, code=...)` (or `recovery_code=...`): the token is
    single use and lives 5 minutes. It is never part of the exception's text.
    """

    def __init__(self, error: ApiError, mfa_token: str) -> None:
        super().__init__(
            error.status, error.code, error.message, retry_after=error.retry_after, request_id=error.request_id
        )
        self.mfa_token = mfa_token


class LoginRequired(AuthRtError):
    """The client holds no session to use or renew: it never logged in, logged out, its session's renewal was
    refused or its answer was lost (the refresh token may be spent: see `Client.refresh`), or the session came
    without a refresh token and its access token has expired. Log in (or exchange) again."""


class ServiceUnreachable(AuthRtError):
    """No answer from the service: connection refused or dropped, DNS, TLS, or a time-out.

    `maybe_received` is False only when the request certainly never left the client (no connection was made:
    refused, DNS, a connect time-out, TLS, a proxy refusing the tunnel), so sending it again repeats nothing;
    True when the service may have received and acted on it (a read time-out, a connection closed or reset
    after the request was sent).
    """

    def __init__(self, message: str, *, maybe_received: bool = True) -> None:
        super().__init__(message)
        self.maybe_received = maybe_received


class ProtocolError(AuthRtError):
    """The service answered something this client cannot read (not the documented format)."""


class WebhookVerificationError(AuthRtError):
    """A webhook delivery failed verification: missing headers, a stale timestamp or no matching signature."""


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` in seconds from now: either delta-seconds or an HTTP date (RFC 9110)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
