"""The OpenID Connect provider: other applications of the product log their users in with this service.

- `clients`: the registered clients (store, rules, Authlib's client model), and the `client_deleted` signal.
- `client_views` and `client_schemas`: `/admin/oauth-clients` (import `clients`; nothing imports them but
  the app factory).
"""
