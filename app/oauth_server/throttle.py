"""Rate limits inside the token endpoint, chosen per grant (one endpoint serves several).

RFC 8693's token exchange logs a person in by a foreign token: it is limited as a login, per client address
(RATE_LIMIT_LOGIN). The OpenID provider's grants are a client's, and a backend redeems codes and refreshes tokens
for all its users from one address, so none of them is limited per address: a refresh per refresh token
(RATE_LIMIT_REFRESH, as POST /auth/refresh), client credentials per client (RATE_LIMIT_LOGIN). Redeeming a code
is not limited: a code is single-use and comes from an authorization, whose sign-in is limited already.
Counted in the limiter's storage (Redis), in windows of their own.
"""

from __future__ import annotations

import math
import time

from flask import current_app
from limits import parse as parse_limit
from limits.strategies import MovingWindowRateLimiter

from ..errors import ApiError
from ..limits import KEYS


def take(name: str, key: str) -> None:
    """Count one request against RATE_LIMIT_<NAME> for `key`, or raise 429 rate_limited (with Retry-After)."""
    settings = current_app.config["SETTINGS"]
    if not settings.rate_limits_enabled:
        return
    limiter = current_app.extensions["rate_limiter"]
    item = parse_limit(getattr(settings, f"rate_limit_{name}"))
    window = MovingWindowRateLimiter(limiter.storage)
    scope = f"oauth_token:{name}"
    if window.hit(item, scope, key):
        return
    reset_at = window.get_window_stats(item, scope, key).reset_time
    retry_after = max(1, math.ceil(reset_at - time.time()))
    raise ApiError(429, "rate_limited", f"Too many requests ({item}); retry later.", {"Retry-After": str(retry_after)})


def take_per_address(name: str) -> None:
    """Count one request against RATE_LIMIT_<NAME> for the client's address (an IPv6 client by its /64)."""
    take(name, "address:" + KEYS["address"]())
