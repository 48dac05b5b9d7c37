"""`/admin/issuers`: the issuers whose tokens the token exchange accepts (admins and `issuers:manage` keys)."""

from __future__ import annotations

import functools

import gevent
from flask import Blueprint, current_app, jsonify

from .. import audit
from ..auth.guards import current_api_key, current_caller, user_or_api_key
from ..errors import forbidden, not_found, validation_failed
from ..http import validated
from ..openapi import operation
from ..outgoing.ssrf import TargetRefused, check_url
from ..redis import get_redis
from . import exchange, store
from .schemas import IssuerAnswer, IssuerPath, IssuerRequest, Issuers

bp = Blueprint("issuers", __name__, url_prefix="/admin/issuers")

SCOPE = "issuers:manage"
MANAGERS = ("bearer", "cookie", "api_key")
RESOLVE_TIMEOUT = 5.0


def managers_only(view):
    """Decorate a view for administrators and API keys with scope issuers:manage (403 for others)."""

    @functools.wraps(view)
    @user_or_api_key(SCOPE)
    def wrapper(*args, **kwargs):
        if current_api_key() is None and not current_caller().is_admin:
            raise forbidden(f"Only administrators (or API keys with scope {SCOPE}) may manage trusted issuers.")
        return view(*args, **kwargs)

    return wrapper


def _checked_url(url: str) -> str:
    """422 unless the URL is one the service may fetch keys from (checked on what its host resolves to now)."""
    settings = current_app.config["SETTINGS"].outgoing_webhooks
    try:
        with gevent.Timeout(RESOLVE_TIMEOUT, TargetRefused("The URL's host could not be resolved in time.")):
            check_url(url, settings.allow_http, settings.allow_private)
    except TargetRefused as refusal:
        raise validation_failed(f"jwks_url: {refusal}") from None
    return url


def _issuer(name: str) -> store.Issuer:
    issuer = store.get_issuer(get_redis(), name)
    if issuer is None:
        raise not_found("No such issuer.")
    return issuer


@bp.put("/<name>")
@operation(
    "Create or replace a trusted issuer",
    tags=["issuers"],
    path=IssuerPath,
    body=IssuerRequest,
    responses={200: IssuerAnswer},
    auth=MANAGERS,
)
@managers_only
def put_issuer(name: str):
    """Create an issuer or replace it; 422 for a bad name, keys, algorithms or URL."""
    asked = validated(IssuerRequest)
    issuer = store.check_issuer(
        store.Issuer(
            name=name,
            issuer=asked.issuer,
            audience=asked.audience,
            algorithms=tuple(dict.fromkeys(asked.algorithms)),
            jwks_url=asked.jwks_url,
            jwks=asked.jwks.model_dump() if asked.jwks is not None else None,
            secret=asked.secret,
            email_claim=asked.email_claim or store.DEFAULT_EMAIL_CLAIM,
            channels_claim=asked.channels_claim,
            info_claim=asked.info_claim,
        )
    )
    if issuer.jwks_url is not None:
        _checked_url(issuer.jwks_url)
    saved, created = store.put_issuer(get_redis(), issuer)
    current_app.extensions["issuer_keys"].forget(name)
    details = {"issuer": name, "created": created, "keys": saved.keys_kind, "algorithms": list(saved.algorithms)}
    audit.record("issuer.put", details=details)
    return jsonify(saved.answer())


@bp.get("")
@operation("Every trusted issuer (never a secret)", tags=["issuers"], responses={200: Issuers}, auth=MANAGERS)
@managers_only
def list_issuers():
    """Every issuer, by name."""
    return jsonify({"issuers": [issuer.answer() for issuer in store.list_issuers(get_redis())]})


@bp.get("/<name>")
@operation(
    "One trusted issuer (never its secret)",
    tags=["issuers"],
    path=IssuerPath,
    responses={200: IssuerAnswer},
    auth=MANAGERS,
)
@managers_only
def get_issuer(name: str):
    """One issuer by name."""
    return jsonify(_issuer(name).answer())


@bp.delete("/<name>")
@operation(
    "Delete a trusted issuer: every session its tokens made ends, with its live connections",
    tags=["issuers"],
    path=IssuerPath,
    responses={204: None},
    auth=MANAGERS,
)
@managers_only
def delete_issuer(name: str):
    """Delete an issuer: its tokens are refused from now on, and the sessions they made end within a second."""
    if not store.delete_issuer(get_redis(), name):
        raise not_found("No such issuer.")
    current_app.extensions["issuer_keys"].forget(name)
    ended = exchange.end_sessions(name)
    audit.record("issuer.deleted", details={"issuer": name, "users_logged_out": ended})
    return "", 204
