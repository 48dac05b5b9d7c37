"""The tokens of a `Client`'s session, renewed shortly before the access token expires, one renewal at a time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from time import monotonic
from time import time as wall_clock
from typing import NamedTuple

from .errors import ApiError, AuthRtError, LoginRequired, ServiceUnreachable
from .models import Tokens

#: Renews a session: presents its refresh token and answers the new tokens.
Renewal = Callable[[Tokens], Tokens]
#: Ends a session at the service (the tokens are forgotten once it returns).
Ending = Callable[[Tokens], None]
# A refused renewal: the refresh token is no longer good (used, revoked, the session ended).
REFUSED = (400, 401)
LOST_RENEWAL = (
    "The session's renewal may have reached the service without its answer reaching the client ({error}). Its "
    "refresh token may be spent, and presenting a spent one ends the session as stolen, so the client has "
    "forgotten the session: log in (or exchange a subject token) again."
)


class Instant(NamedTuple):
    """A moment by two clocks: the monotonic one ignores changes of the wall clock but stands still while the
    machine sleeps; the wall clock goes on across a sleep. A token is due when either says so."""

    monotonic: float
    wall: float

    def plus(self, seconds: float) -> Instant:
        return Instant(self.monotonic + seconds, self.wall + seconds)

    def reached(self, deadline: Instant) -> bool:
        return self.monotonic >= deadline.monotonic or self.wall >= deadline.wall


class SessionTokens:
    """The current tokens of one session, and when to renew them.

    Every renewal happens under one lock: a refresh token is presented once, by one caller, however many
    threads (or greenlets) ask at the same moment. The service takes a second presentation of a used
    refresh token for theft and ends the whole session, so the others wait and take the new tokens.

    For the same reason a failed renewal keeps the refresh token, to present it again, only when the service
    certainly did not rotate it: the request never left the client, or the service refused it before rotating
    (429 and other 4xx but 400 and 401). Any other failure (no answer after sending, a 5xx, perhaps a proxy's
    after forwarding, an unreadable answer) forgets the session and raises `LoginRequired`.
    """

    def __init__(self, renew: Renewal, refresh_before: float) -> None:
        """`renew` rotates the refresh token; the access token is renewed when less than `refresh_before`
        seconds (or half its lifetime, if that is less) are left."""
        self._renew = renew
        self._refresh_before = refresh_before
        self._lock = threading.Lock()
        self._tokens: Tokens | None = None
        self._renew_at = Instant(0.0, 0.0)  # from when the access token counts as about to expire

    @property
    def tokens(self) -> Tokens | None:
        """The session's current tokens, or None without a session."""
        return self._tokens

    @staticmethod
    def now() -> Instant:
        """This moment, by the clocks that time tokens."""
        return Instant(monotonic(), wall_clock())

    def hold(self, tokens: Tokens, requested_at: Instant) -> None:
        """Keep a new session's tokens; `requested_at` is `now()` when they were asked for."""
        with self._lock:
            self._keep(tokens, requested_at)

    def access_token(self) -> str:
        """A current access token: the one held, or a renewed one when it is about to expire."""
        with self._lock:
            tokens = self._required()
            if self.now().reached(self._renew_at):
                tokens = self._renewed(tokens)
            return tokens.access_token

    def renew(self, refused: str | None = None) -> Tokens:
        """Renew now. With `refused`, an access token the service has just refused as expired, only when it is
        still the current one: a caller that waited for another's renewal takes its tokens."""
        with self._lock:
            tokens = self._required()
            if refused is not None and tokens.access_token != refused:
                return tokens
            return self._renewed(tokens)

    def end(self, ending: Ending) -> None:
        """End the session with `ending` and forget its tokens; nothing to do without a session.

        The tokens are kept when the service could not be asked (no answer, 5xx, 429), to try again; a refusal
        (the session had ended already) forgets them as well.
        """
        with self._lock:
            if self._tokens is None:
                return
            try:
                ending(self._tokens)
            except ApiError as error:
                if error.retryable:
                    raise
            self._tokens = None

    def forget(self, session_id: str) -> None:
        """Forget the tokens of that session (it was ended by other means), unless another has replaced it."""
        with self._lock:
            if self._tokens is not None and self._tokens.session_id == session_id:
                self._tokens = None

    def _required(self) -> Tokens:
        if self._tokens is None:
            raise LoginRequired("The client has no session: log in first (or again).")
        return self._tokens

    def _renewed(self, tokens: Tokens) -> Tokens:
        if tokens.refresh_token is None:
            raise LoginRequired(
                "This session came without a refresh token and cannot be renewed: log in, or exchange a new "
                "subject token."
            )
        requested_at = self.now()
        try:
            fresh = self._renew(tokens)
        except BaseException as error:
            if certainly_not_rotated(error):
                raise  # the same refresh token is good for the next try
            # Refused, or perhaps rotated by a request whose answer was lost: never present this token again.
            self._tokens = None
            if not isinstance(error, AuthRtError) or (isinstance(error, ApiError) and error.status in REFUSED):
                raise  # a refusal says so itself; an interruption (or a bug) is passed on as it is
            raise LoginRequired(LOST_RENEWAL.format(error=error)) from error
        self._keep(fresh, requested_at)
        return fresh

    def _keep(self, tokens: Tokens, requested_at: Instant) -> None:
        margin = min(self._refresh_before, tokens.expires_in / 2)
        self._tokens = tokens
        self._renew_at = requested_at.plus(tokens.expires_in - margin)


def certainly_not_rotated(error: BaseException) -> bool:
    """Whether a renewal that failed with `error` certainly left its refresh token unspent: the request never
    left the client, or the service refused it before rotating (429, or a 4xx other than a refused token)."""
    if isinstance(error, ServiceUnreachable):
        return not error.maybe_received
    if isinstance(error, ApiError):
        return error.status < 500 and error.status not in REFUSED
    return False
