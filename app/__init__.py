"""The application factory: the only place settings are read and extensions bound."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from flask import Flask

from . import (
    apidocs,
    apikeys,
    audit,
    cli,
    errors,
    events,
    issuers,
    limits,
    logs,
    mail,
    oauth_server,
    oidc,
    ops,
    outgoing,
    page,
    webhooks,
)
from . import redis as redis_ext
from .admin import console as admin_console
from .admin import views as admin_views
from .apikeys import views as apikey_views
from .audit import views as audit_views
from .auth import account, guards, oauth, passkey_views, passwords, tokens
from .auth import views as auth_views
from .channels import views as channel_views
from .events import views as event_views
from .events.handover import KeepsServerResponse
from .events.opener import StreamOpener
from .events.quick_publish import ROUTES as QUICK_ROUTES
from .events.quick_publish import QuickPublisher
from .issuers import views as issuer_views
from .oauth_server import views as oauth_server_views
from .oidc import authorize as oidc_authorize
from .oidc import backchannel as oidc_backchannel
from .oidc import client_views as oauth_client_views
from .oidc import discovery as oidc_discovery
from .oidc import logout as oidc_logout
from .oidc import views as oidc_views
from .orgs import switch as org_switch
from .orgs import views as org_views
from .outgoing import views as outgoing_views
from .proxy import TrustedProxyFix
from .routing import Route
from .settings import load_settings
from .webhooks import views as webhook_views

JSON_BODY_LIMIT = 64 * 1024


def create_app(environ: Mapping[str, str] | None = None) -> Flask:
    """Build the app from an environment: the process's own, or (tests) a complete one passed in."""
    settings = load_settings(environ)
    app = Flask(__name__)
    app.url_rule_class = Route  # URL builders compiled when first used (routing.py)
    app.config.update(
        SETTINGS=settings,
        SECRET_KEY=str(settings.secret_key),
        MAX_CONTENT_LENGTH=JSON_BODY_LIMIT,
        JSON_SORT_KEYS=False,
        # Flask's session cookie holds one thing only: the state of unfinished OAuth logins. Scoped to
        # the OAuth paths and short-lived; Lax, because the provider's redirect back is a cross-site
        # navigation on which a Strict cookie would not be sent. Tokens never live in it.
        SESSION_COOKIE_NAME="__Secure-oauth",
        SESSION_COOKIE_PATH=oauth.bp.url_prefix,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SECURE=True,
        SESSION_COOKIE_SAMESITE="Lax",
        PERMANENT_SESSION_LIFETIME=oauth.STATE_LIFETIME,
        SESSION_REFRESH_EACH_REQUEST=False,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app.wsgi_app = StreamOpener(app, app.wsgi_app)  # opens most event streams without Flask (opener.py)
    app.wsgi_app = QuickPublisher(app, app.wsgi_app)  # publishes with API keys without Flask (quick_publish.py)
    app.quick_routes = QUICK_ROUTES  # the worker reads these requests itself (quick_http.py)
    if settings.proxy_hops:
        app.wsgi_app = TrustedProxyFix(app.wsgi_app, settings.proxy_hops, settings.forwarded_allow_ips)
    app.wsgi_app = KeepsServerResponse(app.wsgi_app)  # a stream may hand its connection over (handover.py)

    # Infrastructure every feature relies on: the error shape, the request and audit logs, Redis, token
    # keys, the CSRF/CORS guards.
    errors.init_app(app)
    logs.init_app(app)
    audit.init_app(app)
    redis_ext.init_app(app)
    tokens.init_app(app)
    passwords.init_app(app)
    guards.init_app(app)
    # Features: each binds what it needs (providers, the event bus and hub, stores) to the app.
    oauth.init_app(app)
    apikeys.init_app(app)
    events.init_app(app)
    webhooks.init_app(app)
    outgoing.init_app(app)
    issuers.init_app(app)
    oauth_server.init_app(app)
    oidc.init_app(app)
    oidc_backchannel.init_app(app)  # after outgoing: its logouts go through the delivery process
    mail.init_app(app)
    page.init_app(app)
    # Every blueprint, registered here and only here.
    for blueprint in (
        ops.bp,
        auth_views.bp,
        account.bp,
        passkey_views.bp,
        oauth.bp,
        admin_views.bp,
        admin_console.bp,
        apikey_views.bp,
        audit_views.bp,
        event_views.bp,
        channel_views.bp,
        org_views.bp,
        issuer_views.bp,
        oauth_server_views.bp,
        oidc_discovery.bp,
        oauth_client_views.bp,
        oidc_authorize.bp,
        oidc_views.bp,
        oidc_logout.bp,
        org_switch.bp,
        webhook_views.bp,
        outgoing_views.bp,
        outgoing_views.page_bp,
        page.bp,
        apidocs.bp,
    ):
        app.register_blueprint(blueprint)
    # Last: the limiter wraps the views that declare @rate_limited, so every blueprint must be in.
    limits.init_app(app)
    cli.init_app(app)
    app.after_request(_no_store_by_default)
    return app


def _no_store_by_default(response):
    """API answers carry tokens or personal data: no cache keeps them unless a view says otherwise."""
    if response.mimetype == "application/json":
        response.headers.setdefault("Cache-Control", "no-store")
    return response
