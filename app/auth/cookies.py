"""The two token cookies (docs/api.md, Tokens and cookies): HttpOnly, Secure, SameSite=Strict, never read by script."""

from __future__ import annotations

ACCESS_COOKIE = "__Host-access"  # __Host-: Secure, Path=/, no Domain, so no subdomain can set it
REFRESH_COOKIE = "__Secure-refresh"
REFRESH_PATH = "/auth"  # the refresh token is sent only to the endpoints that use it


def set_token_cookies(response, access_token: str, access_ttl: int, refresh_token: str, refresh_ttl: int) -> None:
    """Put both tokens in HttpOnly, Secure, SameSite=Strict cookies (the refresh one only for /auth)."""
    response.set_cookie(
        ACCESS_COOKIE, access_token, max_age=access_ttl, path="/", secure=True, httponly=True, samesite="Strict"
    )
    response.set_cookie(
        REFRESH_COOKIE,
        refresh_token,
        max_age=refresh_ttl,
        path=REFRESH_PATH,
        secure=True,
        httponly=True,
        samesite="Strict",
    )


def clear_token_cookies(response) -> None:
    """Expire both token cookies in the browser."""
    response.delete_cookie(ACCESS_COOKIE, path="/", secure=True, httponly=True, samesite="Strict")
    response.delete_cookie(REFRESH_COOKIE, path=REFRESH_PATH, secure=True, httponly=True, samesite="Strict")
