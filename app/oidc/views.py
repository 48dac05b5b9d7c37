"""The provider's endpoints beside the authorization and token endpoints: `/oauth/userinfo` and `/oauth/revoke`
(Authlib's, errors in RFC 6749 / RFC 6750's shape, never cached), and the user's consents (`/auth/consents`)."""

from __future__ import annotations

import json

from authlib.oauth2.rfc6749 import InvalidRequestError
from flask import Blueprint, current_app, jsonify, make_response, request

from ..auth.guards import current_caller, login_required
from ..errors import not_found
from ..oauth_server.schemas import TokenError
from ..openapi import operation
from . import consents
from .clients import CLIENT_ID
from .schemas import Consent, ConsentPath, Consents, RevocationRequest, Revoked, UserInfo

bp = Blueprint("oidc", __name__)
USER = ("bearer", "cookie")
FORM = "application/x-www-form-urlencoded"
BEARER_CHALLENGE = {"WWW-Authenticate": "Bearer, with error=invalid_token (401) or insufficient_scope (403)."}


@bp.route("/oauth/userinfo", methods=["GET", "POST"])
@operation(
    "OpenID Connect userinfo: the claims a user's client access token (scope openid) allows",
    tags=["openid"],
    responses={200: UserInfo},
    errors=(401, 403),
    error_answer=TokenError,
    auth=("bearer",),
    headers={401: BEARER_CHALLENGE, 403: BEARER_CHALLENGE},
)
def userinfo():
    """The claims about the token's user that its scope allows (RFC 6750 bearer token in the header)."""
    return current_app.extensions["oauth_server"].create_endpoint_response("userinfo")


@bp.post("/oauth/revoke")
@operation(
    "RFC 7009: revoke a client's refresh token (its session ends) or access token (refused from now on)",
    tags=["openid"],
    form=RevocationRequest,
    responses={200: Revoked},
    errors=(400, 401, 413),
    error_answer=TokenError,
    headers={401: {"WWW-Authenticate": "Basic, when client authentication failed."}},
)
def revoke():
    """Revoke a token of the authenticated client's (200 also for a token that is unknown or already gone)."""
    server = current_app.extensions["oauth_server"]
    if request.mimetype != FORM:
        refused = InvalidRequestError(f"The revocation endpoint takes a form ({FORM}).")
        return server.handle_error_response(None, refused)
    return server.create_endpoint_response("revocation")


@bp.after_request
def oauth_answers(response):
    """The OAuth endpoints' answers are never cached; the service's own errors there (a body too large, Redis
    away) take RFC 6749's shape, as the token endpoint's do."""
    if request.path.startswith("/oauth/"):
        if response.status_code >= 400 and response.is_json:
            body = response.get_json(silent=True)
            if isinstance(body, dict) and isinstance(body.get("error"), dict):
                said = body["error"]
                response.set_data(json.dumps({"error": said.get("code"), "error_description": said.get("message")}))
        response.headers["Cache-Control"] = "no-store"
        response.headers["Pragma"] = "no-cache"
    return response


@bp.get("/auth/consents")
@operation("The applications the caller allowed, and what", tags=["openid"], responses={200: Consents}, auth=USER)
@login_required
def list_consents():
    """The caller's consents, newest first."""
    return jsonify({"consents": consents.list_consents(current_caller().user_id)})


@bp.get("/auth/consents/<client_id>")
@operation(
    "What the caller allowed one application", tags=["openid"], path=ConsentPath, responses={200: Consent}, auth=USER
)
@login_required
def get_consent(client_id: str):
    """The caller's consent to one client, or 404."""
    found = consents.get_consent(current_caller().user_id, client_id) if CLIENT_ID.fullmatch(client_id) else None
    if found is None:
        raise not_found("No consent to this application.")
    return jsonify(found)


@bp.delete("/auth/consents/<client_id>")
@operation(
    "Withdraw a consent: the application loses what it was allowed, and its sessions end",
    tags=["openid"],
    path=ConsentPath,
    responses={204: None},
    auth=USER,
)
@login_required
def withdraw_consent(client_id: str):
    """Withdraw the caller's consent to one client (its sessions of the caller end); 404 when there is none."""
    if not CLIENT_ID.fullmatch(client_id) or not consents.withdraw(current_caller().user_id, client_id):
        raise not_found("No consent to this application.")
    response = make_response("", 204)
    del response.headers["Content-Type"]
    return response
