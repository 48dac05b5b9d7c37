"""Registration, login answers, Argon2id storage and rehash, and no secret ever stored in Redis."""

from __future__ import annotations

import json

import pytest
from passlib.context import CryptContext

from app.auth.users import create_user
from app.redis import Keys
from tests.conftest import OWASP_HASHING, https_client
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer, random_email, redis_snapshot


def test_register_returns_the_public_user_only(client):
    email = random_email()
    response = client.post("/auth/register", json={"email": email.upper(), "password": DEFAULT_PASSWORD})
    assert response.status_code == 201
    user = response.get_json()["user"]
    assert set(user) == {"id", "email", "role", "email_verified", "mfa_enabled"}
    assert user["email_verified"] is False and user["mfa_enabled"] is False
    assert user["email"] == email and user["role"] == "user"


def test_register_twice_is_409_whatever_the_case(client, auth):
    user = auth.register()
    response = client.post("/auth/register", json={"email": user["email"].upper(), "password": DEFAULT_PASSWORD})
    assert response.status_code == 409
    assert response.get_json()["error"]["code"] == "conflict"


@pytest.mark.parametrize(
    "email, password",
    [
        ("not-an-email", DEFAULT_PASSWORD),
        ("a@b", DEFAULT_PASSWORD),
        ("spaces in@example.com", DEFAULT_PASSWORD),
        ("x" * 250 + "@example.com", DEFAULT_PASSWORD),
        (None, "1234567"),  # 7 characters
        (None, "p" * 1025),
    ],
)
def test_register_validation_is_422_and_stores_nothing(client, rdb, email, password):
    response = client.post("/auth/register", json={"email": email or random_email(), "password": password})
    assert response.status_code == 422
    assert response.get_json()["error"]["code"] == "validation_failed"
    assert redis_snapshot(rdb) == {}


def test_password_limits_are_inclusive(client):
    for password in ("p" * 8, "p" * 1024):
        assert client.post("/auth/register", json={"email": random_email(), "password": password}).status_code == 201


def test_unknown_email_and_wrong_password_get_identical_answers(client, auth):
    user = auth.register()
    unknown = auth.login(random_email(), DEFAULT_PASSWORD)
    wrong = auth.login(user["email"], "not the password")
    assert unknown.status_code == wrong.status_code == 401
    assert unknown.get_json() == wrong.get_json()
    assert unknown.get_json()["error"]["code"] == "invalid_credentials"
    assert unknown.headers.getlist("Set-Cookie") == wrong.headers.getlist("Set-Cookie") == []


def test_login_response_shape_and_access_token_claims(client, auth):
    tokens = auth.new_user_tokens(device="test runner")
    assert tokens["token_type"] == "Bearer" and tokens["expires_in"] == 900
    assert len(tokens["refresh_token"]) >= 43  # 256 bits, base64url
    import jwt

    header = jwt.get_unverified_header(tokens["access_token"])
    claims = jwt.decode(tokens["access_token"], options={"verify_signature": False})
    assert header == {"alg": "HS256", "typ": "at+jwt"}
    assert set(claims) == {"iss", "aud", "sub", "role", "ver", "sid", "jti", "iat", "exp"}
    assert claims["exp"] - claims["iat"] == 900
    assert claims["sub"] == tokens["user"]["id"] and claims["sid"] == tokens["session_id"]
    me = client.get("/auth/me", headers=bearer(tokens["access_token"])).get_json()
    assert me == {"user": tokens["user"], "session_id": tokens["session_id"]}


@pytest.fixture
def owasp_auth(make_app):
    """Registrations and logins at production's hashing cost (the suite's own is the minimal one)."""
    return AuthActions(https_client(make_app(**OWASP_HASHING)))


def test_password_is_stored_as_argon2id_at_owasp_parameters(owasp_auth, rdb):
    user = owasp_auth.register()
    stored = rdb.hget(Keys.user(user["id"]), "password_hash")
    assert stored.startswith("$argon2id$v=19$m=19456,t=2,p=1$")


def test_login_rehashes_a_hash_made_with_old_parameters(owasp_auth, rdb):
    user = owasp_auth.register()
    weak = CryptContext(schemes=["argon2"], argon2__type="ID", argon2__memory_cost=8192, argon2__time_cost=1)
    rdb.hset(Keys.user(user["id"]), "password_hash", weak.hash(DEFAULT_PASSWORD))
    assert owasp_auth.login(user["email"]).status_code == 200
    assert rdb.hget(Keys.user(user["id"]), "password_hash").startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    assert owasp_auth.login(user["email"]).status_code == 200


def test_the_suites_minimal_cost_is_still_argon2id_and_meets_production_hashes_at_login(auth, owasp_auth, rdb):
    user = auth.register()
    assert rdb.hget(Keys.user(user["id"]), "password_hash").startswith("$argon2id$v=19$m=8,t=1,p=1$")
    assert owasp_auth.login(user["email"]).status_code == 200  # a production app rehashes it at its own cost
    assert rdb.hget(Keys.user(user["id"]), "password_hash").startswith("$argon2id$v=19$m=19456,t=2,p=1$")


def test_password_and_raw_refresh_tokens_never_reach_redis(client, auth, rdb):
    password = "a very distinctive password 9431"
    user = auth.register(password=password)
    tokens = auth.login_body(user["email"], password)
    rotated = client.post("/auth/refresh", json={"refresh_token": tokens["refresh_token"]}).get_json()
    client.post(
        "/auth/password",
        json={"current_password": password, "new_password": password + " changed"},
        headers=bearer(rotated["access_token"]),
    )
    everything = json.dumps(redis_snapshot(rdb, ignore_prefixes=()))
    for secret in (password, tokens["refresh_token"], rotated["refresh_token"], tokens["access_token"]):
        assert secret not in everything
    assert rdb.exists(Keys.user(user["id"]))  # the dump is not empty: it had something to search


def test_a_demoted_admin_loses_admin_rights_on_the_next_request(app, client, auth, rdb):
    email = random_email()
    with app.app_context():
        admin = create_user(email, DEFAULT_PASSWORD, role="admin")
    tokens = auth.login_body(email)
    broadcast = {"channel": "broadcast", "event": "notice", "data": 1}
    assert client.post("/events", json=broadcast, headers=bearer(tokens["access_token"])).status_code == 201
    rdb.hset(Keys.user(admin["id"]), "role", "user")  # what a role change writes
    refused = client.post("/events", json=broadcast, headers=bearer(tokens["access_token"]))
    assert refused.status_code == 403  # the same, still unexpired token
    assert client.get("/auth/me", headers=bearer(tokens["access_token"])).get_json()["user"]["role"] == "user"
