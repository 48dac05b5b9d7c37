"""The service as an OAuth 2.0 authorization server: the token endpoint and its grant types.

- `server`: Authlib's AuthorizationServer, reading parameters from the form body only (imports grants).
- `grants`: the grant classes; RFC 8693's token exchange calls app/issuers/exchange.py.
- `views` and `schemas`: `POST /oauth/token` (import the modules above; none imports them).
"""

from __future__ import annotations

from flask import Flask

from .server import AuthorizationServer


def init_app(app: Flask) -> None:
    """The authorization server of this app, with its grants."""
    server = AuthorizationServer()
    server.init_app(app)
    app.extensions["oauth_server"] = server
