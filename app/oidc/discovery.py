"""`GET /.well-known/openid-configuration` and `GET /.well-known/jwks.json`: what relying parties read first.

Both are public, the same for everyone, and built from the settings and the keys, never from the request (its
Host header is the client's choice). Pages of other sites may read them (`Access-Control-Allow-Origin: *`): a
single-page application fetches them from the browser. They are cacheable for a short time only, so a rotated
key or a changed setting is seen soon; a relying party that meets an unknown `kid` fetches the JWKS again.
"""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify

from ..oauth_server.grants import TOKEN_EXCHANGE
from ..openapi import operation
from . import keys
from .clients import AUTH_METHODS, GRANT_TYPES, RESPONSE_TYPES, SCOPES
from .discovery_schemas import DiscoveryDocument, JwkSet
from .issuer import endpoint, issuer

bp = Blueprint("oidc_discovery", __name__)

JWKS_MAX_AGE = 60  # seconds: a retired key leaves relying parties' caches within a minute
DISCOVERY_MAX_AGE = 300
CLAIMS = (
    "iss",
    "sub",
    "aud",
    "exp",
    "iat",
    "auth_time",
    "nonce",
    "sid",
    "amr",
    "at_hash",
    "email",
    "email_verified",
    "preferred_username",
    "orgs",
)


def discovery_document() -> dict:
    """The provider's metadata: its issuer, endpoints and what it supports."""
    auth_methods = list(dict.fromkeys(method for methods in AUTH_METHODS.values() for method in methods))
    return {
        "issuer": issuer(),
        "authorization_endpoint": endpoint("/oauth/authorize"),
        "token_endpoint": endpoint("/oauth/token"),
        "userinfo_endpoint": endpoint("/oauth/userinfo"),
        "jwks_uri": endpoint("/.well-known/jwks.json"),
        "revocation_endpoint": endpoint("/oauth/revoke"),
        "end_session_endpoint": endpoint("/oauth/logout"),
        "introspection_endpoint": endpoint("/auth/introspect"),
        "response_types_supported": list(RESPONSE_TYPES),
        "response_modes_supported": ["query"],
        "grant_types_supported": [*GRANT_TYPES, TOKEN_EXCHANGE],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": keys.algorithms(),
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": auth_methods,
        "revocation_endpoint_auth_methods_supported": auth_methods,
        "scopes_supported": list(SCOPES),
        "claims_supported": list(CLAIMS),
        "backchannel_logout_supported": True,
        "backchannel_logout_session_supported": True,
        "frontchannel_logout_supported": False,
        "authorization_response_iss_parameter_supported": True,
        "request_parameter_supported": False,
        "request_uri_parameter_supported": False,
        "claims_parameter_supported": False,
    }


def key_set() -> dict:
    """Every OpenID provider key still published, then the access-token key when it is asymmetric."""
    published = keys.public_jwks()
    kids = {key["kid"] for key in published}
    access = [key for key in current_app.extensions["token_keys"].jwks["keys"] if key["kid"] not in kids]
    return {"keys": published + access}


def _public(document: dict, max_age: int):
    response = jsonify(document)
    response.headers["Cache-Control"] = f"public, max-age={max_age}"
    response.headers["Access-Control-Allow-Origin"] = "*"
    return response


@bp.get("/.well-known/openid-configuration")
@operation("The OpenID provider's discovery document", tags=["openid"], responses={200: DiscoveryDocument})
def openid_configuration():
    """OpenID Connect Discovery 1.0: the issuer, the endpoints and what they support."""
    return _public(discovery_document(), DISCOVERY_MAX_AGE)


@bp.get("/.well-known/jwks.json")
@operation("The public keys that verify the service's tokens", tags=["openid"], responses={200: JwkSet})
def jwks():
    """The keys that sign, or signed tokens still alive (each with kid, alg, use), public parts only."""
    return _public(key_set(), JWKS_MAX_AGE)
