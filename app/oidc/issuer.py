"""The OpenID provider's issuer: the URL that names this service in its tokens and its discovery document."""

from __future__ import annotations

from flask import current_app

from ..mail import DEVELOPMENT_BASE_URL


def issuer() -> str:
    """OIDC_ISSUER, else PUBLIC_BASE_URL, else (development and tests: production requires PUBLIC_BASE_URL) the
    development address mail links use.

    Never the request's Host: a client chooses it, and tokens or a discovery document naming a forged host would
    send relying parties elsewhere.
    """
    return current_app.config["SETTINGS"].oidc_issuer or DEVELOPMENT_BASE_URL


def endpoint(path: str) -> str:
    """The URL of one of this service's endpoints, under the issuer (`/oauth/token` -> `<issuer>/oauth/token`)."""
    return issuer() + path
