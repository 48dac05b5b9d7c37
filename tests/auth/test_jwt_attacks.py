"""Forged access tokens: each built from a real login's claims, so only the attack differs; all 401."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from app.auth.tokens import AccessTokenJWS, AccessTokenJWT
from tests.conftest import TEST_JWT_SECRET, https_client
from tests.utils import AuthActions, bearer

# Forgeries deliberately use short or empty HMAC keys; PyJWT warns when *signing* them.
pytestmark = [
    pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning"),
    pytest.mark.not_on_cluster("a forged token is refused before its session is looked up, whatever the Redis"),
]

REQUIRED = ["iss", "aud", "sub", "role", "ver", "sid", "jti", "iat", "exp"]


def b64(data: dict | bytes) -> str:
    raw = json.dumps(data).encode() if isinstance(data, dict) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def real_claims(token: str) -> dict:
    return jwt.decode(token, options={"verify_signature": False})


@pytest.fixture
def session(auth):
    tokens = auth.new_user_tokens()
    return tokens, real_claims(tokens["access_token"])


def sign(claims: dict, key=TEST_JWT_SECRET, algorithm="HS256", headers=None) -> str:
    return jwt.encode(claims, key, algorithm=algorithm, headers={"typ": "at+jwt", **(headers or {})})


def hmac_sign(header: dict, claims: dict, key: bytes) -> str:
    """HS256 by hand, for keys PyJWT itself refuses to use (empty, or a PEM public key)."""
    signing_input = f"{b64(header)}.{b64(claims)}"
    return f"{signing_input}.{b64(hmac.new(key, signing_input.encode(), hashlib.sha256).digest())}"


def assert_refused(client, token: str, code: str = "unauthorized"):
    response = client.get("/auth/me", headers=bearer(token))
    assert response.status_code == 401, response.get_json()
    assert response.get_json()["error"]["code"] == code


def test_control_a_correctly_signed_copy_is_accepted(client, session):
    """Proves the forgeries below fail for their attack, not for their claims."""
    _, claims = session
    assert client.get("/auth/me", headers=bearer(sign(claims))).status_code == 200


@pytest.mark.parametrize("alg", ["none", "None", "NONE", "nOnE"])
def test_alg_none_is_refused(client, session, alg):
    _, claims = session
    token = f"{b64({'alg': alg, 'typ': 'at+jwt'})}.{b64(claims)}."
    assert_refused(client, token)


@pytest.mark.parametrize("algorithm", ["HS384", "HS512"])
def test_other_hmac_algorithm_with_the_right_secret_is_refused(client, session, algorithm):
    _, claims = session
    assert_refused(client, sign(claims, algorithm=algorithm))


def test_tampered_payload_role_admin_is_refused(client, session):
    tokens, claims = session
    header, _, signature = tokens["access_token"].split(".")
    assert_refused(client, f"{header}.{b64({**claims, 'role': 'admin'})}.{signature}")


def test_wrong_key_is_refused(client, session):
    _, claims = session
    assert_refused(client, sign(claims, key="another-secret-of-sufficient-length-123456"))


def test_expired_token_is_refused_as_expired(client, session):
    _, claims = session
    now = int(time.time())
    assert_refused(client, sign({**claims, "iat": now - 1000, "exp": now - 100}), "token_expired")


def test_a_token_accepted_before_is_refused_as_expired_once_its_time_has_passed(client, session):
    """A verified token's claims are kept; its expiry is still checked on every request."""
    _, claims = session
    expires_at = int(time.time()) + 1
    token = sign({**claims, "exp": expires_at})
    assert client.get("/auth/me", headers=bearer(token)).status_code == 200
    assert client.get("/auth/me", headers=bearer(token)).status_code == 200
    time.sleep(max(0.0, expires_at - time.time()) + 0.01)  # the clock passing the expiry is what is tested
    assert_refused(client, token, "token_expired")


@pytest.mark.parametrize("claim", REQUIRED)
def test_missing_required_claim_is_refused(client, session, claim):
    _, claims = session
    assert_refused(client, sign({k: v for k, v in claims.items() if k != claim}))


@pytest.mark.parametrize("claim, value", [("iss", "https://evil.example"), ("aud", "another-api")])
def test_wrong_issuer_or_audience_is_refused(client, session, claim, value):
    _, claims = session
    assert_refused(client, sign({**claims, claim: value}))


def test_wrong_type_header_is_refused(client, session):
    _, claims = session
    assert_refused(client, jwt.encode(claims, TEST_JWT_SECRET, algorithm="HS256", headers={"typ": "JWT"}))


def test_embedded_jwk_header_is_not_trusted(client, session):
    _, claims = session
    attacker = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_jwk = jwt.algorithms.RSAAlgorithm.to_jwk(attacker.public_key(), as_dict=True)
    assert_refused(client, sign(claims, key=attacker, algorithm="RS256", headers={"jwk": public_jwk}))


def test_kid_with_path_traversal_is_refused(client, session):
    _, claims = session
    # A verifier that loaded keys by kid would read /dev/null: an empty key.
    token = hmac_sign({"alg": "HS256", "typ": "at+jwt", "kid": "../../../../dev/null"}, claims, b"")
    assert_refused(client, token)


def test_garbage_is_refused(client):
    for token in ("not-a-jwt", "a.b.c", "....", "e30.e30.e30"):
        assert_refused(client, token)


# An asymmetric key: EdDSA with a kid and a JWKS document.


@pytest.fixture
def eddsa_key() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.generate()


@pytest.fixture
def eddsa_client(make_app, eddsa_key):
    pem = eddsa_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return https_client(make_app(JWT_ALGORITHM="EdDSA", JWT_PRIVATE_KEY=pem, JWT_SECRET=""))


def test_eddsa_tokens_carry_kid_published_in_jwks(eddsa_client, eddsa_key):
    tokens = AuthActions(eddsa_client).new_user_tokens()
    header = jwt.get_unverified_header(tokens["access_token"])
    assert header["alg"] == "EdDSA" and header["typ"] == "at+jwt"
    jwks = eddsa_client.get("/.well-known/jwks.json").get_json()
    published = {key["kid"]: key for key in jwks["keys"]}  # beside the OpenID provider's keys
    assert header["kid"] in published
    public_key = jwt.PyJWK(published[header["kid"]]).key
    claims = jwt.decode(tokens["access_token"], public_key, algorithms=["EdDSA"], audience="auth-rt")
    assert claims["sub"] == tokens["user"]["id"]
    assert "password" not in json.dumps(claims)
    assert eddsa_client.get("/auth/me", headers=bearer(tokens["access_token"])).status_code == 200


def test_eddsa_refuses_hs256_signed_with_the_public_key(eddsa_client, eddsa_key):
    """Algorithm confusion: the public key used as an HMAC secret."""
    tokens = AuthActions(eddsa_client).new_user_tokens()
    claims = real_claims(tokens["access_token"])
    kid = jwt.get_unverified_header(tokens["access_token"])["kid"]
    public_pem = eddsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert_refused(eddsa_client, hmac_sign({"alg": "HS256", "typ": "at+jwt", "kid": kid}, claims, public_pem))


def test_an_hs256_service_publishes_no_shared_secret(client):
    """The JWKS holds the OpenID provider's public keys only: never the HMAC secret access tokens are signed with."""
    answer = client.get("/.well-known/jwks.json")
    assert answer.status_code == 200
    for key in answer.get_json()["keys"]:
        assert key["kty"] in {"RSA", "EC", "OKP"} and key["alg"] in {"RS256", "ES256", "EdDSA"}, key
        assert "k" not in key and "d" not in key, key


def test_a_token_signed_to_live_longer_than_15_minutes_is_refused(client, session):
    _, claims = session
    assert_refused(client, sign({**claims, "exp": claims["iat"] + 901}))
    assert_refused(client, sign({**claims, "iat": claims["iat"] - 3600}))  # backdated: exp - iat > 900
    assert_refused(client, sign({**claims, "iat": float(claims["iat"])}))  # times are whole seconds


# The service's own PyJWT (app/auth/tokens.py): a segment's alphabet checked by one regular expression, the secret
# prepared once. Its outcome must be PyJWT's for every segment and every token.

SEGMENT_BYTES = st.lists(st.sampled_from(list(b"AZaz09-_+/=.!\n \x00\xff")), max_size=40).map(bytes)


@settings(max_examples=400, deadline=None)
@given(segment=st.one_of(SEGMENT_BYTES, st.binary(max_size=40), st.binary(max_size=30).map(base64.urlsafe_b64encode)))
def test_a_segment_is_decoded_or_refused_exactly_as_pyjwt_does(segment):
    def outcome(decode):
        try:
            return decode(segment, "payload")
        except jwt.DecodeError as error:
            return f"refused: {error}"

    assert outcome(AccessTokenJWS._decode_base64url_segment) == outcome(jwt.PyJWS._decode_base64url_segment)


def _signed(secret: str, **header) -> str:
    """A token signed with `secret` by hand, so that headers PyJWT would not sign (alg none, crit) can be made."""
    now = int(time.time())
    claims = {"iss": "i", "aud": "a", "sub": "u", "role": "user", "ver": 1, "sid": "s", "jti": "j", "iat": now}
    signing_input = f"{b64({'alg': 'HS256', 'typ': 'at+jwt', **header})}.{b64({**claims, 'exp': now + 900})}"
    signature = hmac.new(secret.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


@settings(max_examples=200, deadline=None)
@given(
    at=st.one_of(st.none(), st.integers(min_value=0, max_value=400)),  # None: the token as signed
    character=st.sampled_from("Aa0-_+/=.!é"),
    header=st.sampled_from([{}, {"alg": "none"}, {"crit": ["exp"]}, {"b64": False}, {"kid": 7}]),
)
def test_a_token_is_judged_exactly_as_pyjwt_judges_it(at, character, header):
    secret = TEST_JWT_SECRET
    token = _signed(secret, **header)
    if at is not None:  # one character changed
        token = token[: at % len(token)] + character + token[at % len(token) + 1 :]

    def outcome(decode):
        try:
            return decode(token, secret, algorithms=["HS256"], audience="a", issuer="i")
        except jwt.InvalidTokenError as error:
            return f"{type(error).__name__}: {error}"

    ours = AccessTokenJWT("HS256", secret)
    assert outcome(ours.decode_complete) == outcome(jwt.decode_complete)
