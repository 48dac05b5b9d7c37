"""The OpenID Connect provider: other applications of the product log their users in with this service.

- `issuer`: the issuer URL (settings only, never a request's Host) and the endpoints' URLs under it (imports
  nothing of this package).
- `keys`: the signing keys (made lazily, kept in Redis sealed under a key derived from SECRET_KEY, rotated and
  retired by the CLI), signing with the current key and verifying the provider's own tokens (imports `issuer`).
- `clients`: the registered clients (store, rules, Authlib's client model), and the `client_deleted` signal.
- `client_views` and `client_schemas`: `/admin/oauth-clients` (import `clients`; nothing imports them but
  the app factory).
- `discovery` and `discovery_schemas`: `/.well-known/openid-configuration` and `/.well-known/jwks.json`
  (import `issuer`, `keys` and `clients`; nothing imports them but the app factory).
"""

from __future__ import annotations

from flask import Flask

from . import keys


def init_app(app: Flask) -> None:
    """This process's signing keys (nothing is read from Redis or made before the first need)."""
    keys.init_app(app)
