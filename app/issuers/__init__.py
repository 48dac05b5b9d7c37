"""Trusted issuers: tokens from the application's own backend (or Auth0, Clerk, Keycloak...) exchanged for
sessions here (RFC 8693), for users identified by the issuer's name and the token's `sub`.

- `store`: the issuers' records (what is checked at PUT, what is stored, what answers show).
- `keys`: each issuer's verification keys (inline, a secret, or fetched from its JWKS URL and kept per
  process) and the check of a subject token with them (imports store).
- `exchange`: the exchange itself (verify, find or make the user, grant the channels a claim lists, start
  the session), and the end of an issuer's sessions when it is deleted (imports store and keys).
- `views` and `schemas`: `/admin/issuers` (import the modules above; none imports them). The token
  endpoint that calls `exchange` is Authlib's, in app/oauth_server/.
"""

from __future__ import annotations

from flask import Flask

from ..outgoing.sender import Sender
from .keys import IssuerKeys

POOL_SIZE = 4  # kept connections per issuer's JWKS host, per process


def init_app(app: Flask) -> None:
    """One Sender for issuers' JWKS URLs in this process, and the keys kept with it."""
    settings = app.config["SETTINGS"].outgoing_webhooks
    app.extensions["issuer_keys"] = IssuerKeys(Sender(settings, POOL_SIZE, purpose="trusted issuer"))
