"""The OpenID Connect provider: other applications of the product log their users in with this service.

Protocols are Authlib's (its authorization server, grants, PKCE, OpenID Connect's code flow, revocation and
userinfo endpoints); what is here is storage in Redis and the service's session rules.

- `issuer`: the issuer URL (settings only, never a request's Host) and the endpoints' URLs under it (imports
  nothing of this package).
- `keys`: the signing keys (made lazily, kept in Redis sealed under a key derived from SECRET_KEY, rotated and
  retired by the CLI), signing with the current key and verifying the provider's own tokens (imports `issuer`).
- `clients`: the registered clients (store, rules, Authlib's client model), and the `client_deleted` signal.
- `client_views` and `client_schemas`: `/admin/oauth-clients` (import `clients`; nothing imports them but
  the app factory).
- `discovery` and `discovery_schemas`: `/.well-known/openid-configuration` and `/.well-known/jwks.json`
  (import `issuer`, `keys` and `clients`; nothing imports them but the app factory).
- `codes`: authorization codes (used once; a second use ends what the first gave). `consents`: what each user
  let each client have. `sessions`: client sessions (an authorization is a session of app/auth/sessions.py),
  the browser session that authorizes, and refresh-token credentials (imports `codes`, `clients`).
- `access_tokens`: the JWT access tokens issued to clients, verified for userinfo, introspection and the events
  endpoints (imports `keys`, `clients`). `claims`: what a scope says about a user, and the ID token.
- `grants` and `endpoints`: Authlib's grants and endpoints with the above; registered on the service's
  authorization server by app/oauth_server/server.py (they import the modules above, not the views).
- `authorize`, `views` and `schemas`: `/oauth/authorize` (consent page), `/oauth/userinfo`, `/oauth/revoke` and
  `/auth/consents` (nothing imports them but the app factory).
- `backchannel` and `logout`: back-channel logout and `/oauth/logout` (import `sessions`, `keys`, `clients`).
"""

from __future__ import annotations

from flask import Flask

from . import access_tokens, consents, keys


def init_app(app: Flask) -> None:
    """This process's signing keys (nothing is read from Redis or made before the first need); client access
    tokens known to the guards and introspection; a deleted client's consents and sessions ended."""
    keys.init_app(app)
    access_tokens.init_app(app)
    consents.init_app(app)
