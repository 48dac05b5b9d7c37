"""`/.well-known/openid-configuration` and `/.well-known/jwks.json`: built from the settings and the keys, read by
relying parties (Authlib validates the metadata, PyJWT verifies with the key set)."""

from __future__ import annotations

import jwt
import pytest
from authlib.oidc.discovery import OpenIDProviderMetadata
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from app.mail import DEVELOPMENT_BASE_URL
from app.oidc import keys
from app.oidc.discovery_schemas import DiscoveryDocument, JwkSet
from app.oidc.issuer import issuer
from tests.conftest import https_client
from tests.utils import AuthActions

ISSUER = "https://id.example.test"


def discovery(client, **headers) -> dict:
    answer = client.get("/.well-known/openid-configuration", headers=headers)
    assert answer.status_code == 200, answer.get_json()
    assert answer.headers["Cache-Control"] == "public, max-age=300"
    assert answer.headers["Access-Control-Allow-Origin"] == "*"
    return answer.get_json()


def test_the_discovery_document_names_the_issuer_and_every_endpoint(make_app):
    client = https_client(make_app(OIDC_ISSUER=ISSUER, PUBLIC_BASE_URL="https://auth.example.test"))
    document = discovery(client, Host="evil.example")  # a forged Host changes nothing
    OpenIDProviderMetadata(document).validate()
    DiscoveryDocument.model_validate(document)
    assert document["issuer"] == ISSUER
    assert {name: document[name] for name in document if name.endswith(("_endpoint", "_uri"))} == {
        "authorization_endpoint": f"{ISSUER}/oauth/authorize",
        "token_endpoint": f"{ISSUER}/oauth/token",
        "userinfo_endpoint": f"{ISSUER}/oauth/userinfo",
        "jwks_uri": f"{ISSUER}/.well-known/jwks.json",
        "revocation_endpoint": f"{ISSUER}/oauth/revoke",
        "end_session_endpoint": f"{ISSUER}/oauth/logout",
        "introspection_endpoint": f"{ISSUER}/auth/introspect",
    }
    assert document["response_types_supported"] == ["code"]
    assert document["code_challenge_methods_supported"] == ["S256"]
    assert document["subject_types_supported"] == ["public"]
    assert document["id_token_signing_alg_values_supported"] == ["RS256"]
    assert document["token_endpoint_auth_methods_supported"] == ["client_secret_basic", "client_secret_post", "none"]
    assert document["scopes_supported"] == ["openid", "email", "profile", "offline_access", "events", "orgs"]
    assert set(document["grant_types_supported"]) == {
        "authorization_code",
        "refresh_token",
        "client_credentials",
        "urn:ietf:params:oauth:grant-type:token-exchange",
    }
    assert {"sub", "sid", "amr", "auth_time", "nonce", "at_hash", "email", "email_verified"} <= set(
        document["claims_supported"]
    )
    assert document["backchannel_logout_supported"] is document["backchannel_logout_session_supported"] is True
    assert document["authorization_response_iss_parameter_supported"] is True
    assert document["frontchannel_logout_supported"] is False
    assert "evil.example" not in str(document)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"PUBLIC_BASE_URL": "https://auth.example.test"}, "https://auth.example.test"),
        ({"OIDC_ISSUER": "https://auth.example.test/id/"}, "https://auth.example.test/id"),
        ({}, DEVELOPMENT_BASE_URL),  # development and tests only: production requires PUBLIC_BASE_URL
    ],
    ids=["public-base-url", "oidc-issuer-with-a-path", "development"],
)
def test_the_issuer_comes_from_the_settings_never_the_host(make_app, settings, expected):
    client = https_client(make_app(**settings))
    document = discovery(client, Host="evil.example")
    assert document["issuer"] == expected and document["token_endpoint"] == f"{expected}/oauth/token"


def test_the_algorithms_listed_follow_the_setting(make_app):
    assert discovery(https_client(make_app(OIDC_ID_TOKEN_ALG="EdDSA")))["id_token_signing_alg_values_supported"] == [
        "EdDSA"
    ]


def test_the_jwks_answers_with_the_oidc_key_when_access_tokens_use_a_shared_secret(app, client):
    """HS256 access tokens have no public key; the JWKS is still there, with the provider's key (never a 404)."""
    answer = client.get("/.well-known/jwks.json")
    assert answer.status_code == 200
    assert answer.headers["Cache-Control"] == "public, max-age=60"
    JwkSet.model_validate(answer.get_json())
    (published,) = answer.get_json()["keys"]
    with app.app_context():
        assert published["kid"] == keys.signing_key().kid


def test_the_jwks_lists_the_access_token_key_beside_the_oidc_keys(make_app):
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    app = make_app(JWT_ALGORITHM="ES256", JWT_PRIVATE_KEY=pem, JWT_SECRET="", OIDC_ID_TOKEN_ALG="EdDSA")
    client = https_client(app)
    access_token = AuthActions(client).new_user_tokens()["access_token"]
    with app.app_context():
        oidc_token = keys.sign({"iss": issuer(), "sub": "u", "aud": "c", "iat": 0, "exp": 2**31})
    jwks = client.get("/.well-known/jwks.json").get_json()
    JwkSet.model_validate(jwks)
    kids = [jwt.get_unverified_header(token)["kid"] for token in (oidc_token, access_token)]
    assert [(key["kid"], key["alg"], key["use"]) for key in jwks["keys"]] == [
        (kids[0], "EdDSA", "sig"),
        (kids[1], "ES256", "sig"),
    ]
    key_set = jwt.PyJWKSet.from_dict(jwks)
    assert jwt.decode(access_token, key_set[kids[1]].key, algorithms=["ES256"], audience="auth-rt")["sub"]
    assert jwt.decode(oidc_token, key_set[kids[0]].key, algorithms=["EdDSA"], audience="c")["sub"] == "u"
