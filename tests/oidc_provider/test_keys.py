"""The OpenID provider's signing keys: made once, sealed at rest, rotated and retired, verified by PyJWT as a relying
party would, through the JWKS."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import threading
import time

import jwt
import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from app.audit.store import read as read_audit
from app.oidc import keys
from app.oidc.issuer import issuer
from app.redis import Keys
from tests.conftest import TEST_SECRET_KEY, https_client, run_cli
from tests.servers import LiveServer, flush_redis, wait_until
from tests.utils import redis_snapshot

PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi")
OTHER_SECRET_KEY = "another-secret-key-" + "o" * 32


@pytest.fixture(scope="module", autouse=True)
def _leave_no_keys(redis_server):
    """The keys these tests make (one sealed under another SECRET_KEY) must not sign for the next module's server."""
    yield
    flush_redis(redis_server)


def claims(app, **extra) -> dict:
    """An access token's claims, for this app's issuer, alive for five minutes."""
    with app.app_context():
        now = int(time.time())
        return {"iss": issuer(), "sub": "user-1", "aud": "client-1", "iat": now, "exp": now + 300, **extra}


def sign(app, **extra) -> str:
    """A `typ: at+jwt` token signed with the app's current key."""
    with app.app_context():
        return keys.sign(claims(app, **extra), typ="at+jwt")


def verifies(app, token: str) -> bool:
    """Whether the app accepts `token` as one of its own."""
    with app.app_context():
        try:
            keys.verify(token, typ="at+jwt", audience="client-1")
        except keys.TokenInvalid:
            return False
        return True


def kid_of(token: str) -> str:
    return jwt.get_unverified_header(token)["kid"]


def published_kids(client) -> list[str]:
    answer = client.get("/.well-known/jwks.json")
    assert answer.status_code == 200, answer.get_json()
    return [key["kid"] for key in answer.get_json()["keys"]]


def verify_as_relying_party(jwks: dict, token: str, algorithm: str) -> dict:
    """What an independent relying party does: pick the key by kid from the JWKS (PyJWKSet), decode with PyJWT."""
    key = jwt.PyJWKSet.from_dict(jwks)[kid_of(token)]
    return jwt.decode(token, key.key, algorithms=[algorithm], audience="client-1")


def thumbprint(jwk: dict) -> str:
    """RFC 7638, computed here from the published members."""
    required = {"RSA": ("e", "kty", "n"), "EC": ("crv", "kty", "x", "y"), "OKP": ("crv", "kty", "x")}[jwk["kty"]]
    canonical = json.dumps({name: jwk[name] for name in required}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()


def audit_entries(app, entry_type: str) -> list[dict]:
    with app.app_context():
        return read_audit(entry_type=entry_type)[0]


def stored_kids(rdb) -> set[str]:
    return set(rdb.hkeys(Keys.signing_keys()))


# Made once.


def test_concurrent_first_needs_in_four_apps_make_one_key(make_app, rdb):
    """Four apps (as four workers), two threads each, all needing a key at once: one key is made, all use it."""
    apps = [make_app() for _ in range(4)]
    start = threading.Barrier(8)
    seen, failures = [], []

    def need_a_key(app, signs: bool):
        try:
            with app.app_context():
                start.wait(timeout=30)
                seen.append(keys.signing_key().kid if signs else keys.public_jwks()[0]["kid"])
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            failures.append(error)

    threads = [threading.Thread(target=need_a_key, args=(app, n % 2 == 0)) for app in apps for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert len(seen) == 8 and len(set(seen)) == 1
    assert stored_kids(rdb) == set(seen)
    made = audit_entries(apps[0], "signing_key.rotated")
    assert [(entry["details"]["kid"], entry["actor"]["kind"]) for entry in made] == [(seen[0], "system")]


def test_a_gunicorn_with_two_workers_and_another_app_make_one_key(base_env, rdb, make_app, tmp_path):
    """Across processes: concurrent first JWKS requests to two gevent workers, and a token signed in this process."""
    server = LiveServer(base_env, workers=2, log_path=tmp_path / "gunicorn.log")
    server.start()
    try:
        app = make_app()
        start = threading.Barrier(9)
        kids, failures = [], []

        def fetch():
            try:
                start.wait(timeout=30)
                answer = requests.get(f"{server.url}/.well-known/jwks.json", timeout=30)
                assert answer.status_code == 200, answer.text
                assert answer.headers["Cache-Control"] == "public, max-age=60"
                assert answer.headers["Access-Control-Allow-Origin"] == "*"
                kids.append([key["kid"] for key in answer.json()["keys"]])
            except Exception as error:  # noqa: BLE001 - reported by the assertion below
                failures.append(error)

        threads = [threading.Thread(target=fetch) for _ in range(8)]
        for thread in threads:
            thread.start()
        start.wait(timeout=30)
        token = sign(app)
        for thread in threads:
            thread.join(60)
        assert failures == []
        assert kids == [[kid_of(token)]] * 8
        assert stored_kids(rdb) == {kid_of(token)}
        jwks = requests.get(f"{server.url}/.well-known/jwks.json", timeout=30).json()
        assert verify_as_relying_party(jwks, token, "RS256")["sub"] == "user-1"
    finally:
        server.stop()


# Sealed at rest.


@pytest.mark.parametrize("algorithm", keys.ALGORITHMS)
def test_redis_holds_no_private_key_material_in_clear(make_app, rdb, algorithm):
    app = make_app(OIDC_ID_TOKEN_ALG=algorithm)
    with app.app_context():
        private = keys.signing_key().key
    members = private.as_dict(private=True)
    secrets_in_clear = [members[name] for name in PRIVATE_MEMBERS if name in members]
    pem = private.as_pem(private=True).decode()
    secrets_in_clear += [line for line in pem.splitlines() if line and "-----" not in line]
    dump = json.dumps(redis_snapshot(rdb))
    assert secrets_in_clear and not [secret for secret in secrets_in_clear if secret in dump]
    assert "PRIVATE KEY" not in dump
    (record,) = (json.loads(value) for value in rdb.hvals(Keys.signing_keys()))
    assert not set(PRIVATE_MEMBERS) & set(record["public"])
    assert record["sealed"].startswith("v1:")


def test_another_secret_key_cannot_sign_but_still_publishes_and_verifies(make_app, rdb, caplog):
    first = make_app()
    token = sign(first)
    other = make_app(SECRET_KEY=OTHER_SECRET_KEY)
    with other.app_context(), caplog.at_level(logging.ERROR, logger="app.oidc.keys"):
        for _ in range(2):
            with pytest.raises(keys.SigningKeyUnreadable) as refused:
                keys.signing_key()
            assert (refused.value.status, refused.value.code) == (503, "unavailable")
    told = [record.getMessage() for record in caplog.records if record.name == "app.oidc.keys"]
    assert len(told) == 1 and kid_of(token) in told[0] and "keys rotate" in told[0]  # once, saying what to do
    assert TEST_SECRET_KEY not in told[0] and OTHER_SECRET_KEY not in told[0]
    client = https_client(other)
    assert published_kids(client) == [kid_of(token)] and verifies(other, token)


def test_rotating_under_a_new_secret_key_signs_again_and_keeps_the_old_tokens(make_app, rdb):
    first = make_app()
    old_token = sign(first)
    other = make_app(SECRET_KEY=OTHER_SECRET_KEY)
    client = https_client(other)
    listed = run_cli(other, "keys", "list")
    assert listed.returncode == 0 and "does not open with this SECRET_KEY" in listed.stdout
    rotated = run_cli(other, "keys", "rotate")
    assert rotated.returncode == 0, rotated.stderr
    new_token = sign(other)
    assert kid_of(new_token) == rotated.stdout.strip() != kid_of(old_token)
    assert published_kids(client) == [kid_of(new_token), kid_of(old_token)]
    assert verifies(other, old_token) and verifies(other, new_token)


# Rotation and retirement.


def test_rotate_signs_with_a_new_key_and_keeps_the_old_one_published(app, client, cli, make_app):
    old_token = sign(app)
    other_worker = make_app()
    assert kid_of(sign(other_worker)) == kid_of(old_token)
    rotated = cli("keys", "rotate")
    assert rotated.returncode == 0, rotated.stderr
    new_kid = rotated.stdout.strip()
    assert new_kid != kid_of(old_token) and kid_of(old_token) in rotated.stderr
    assert kid_of(sign(app)) == new_kid
    wait_until(lambda: kid_of(sign(other_worker)) == new_kid, timeout=10, message="the other app signing anew")
    assert published_kids(client) == [new_kid, kid_of(old_token)]
    jwks = client.get("/.well-known/jwks.json").get_json()
    assert verify_as_relying_party(jwks, old_token, "RS256")["sub"] == "user-1"
    assert verifies(app, old_token) and verifies(other_worker, old_token)
    listed = cli("keys", "list").stdout.splitlines()
    assert listed[0].startswith(f"{new_kid}  RS256  created ") and listed[0].endswith("signs now")
    assert listed[1].startswith(f"{kid_of(old_token)}  RS256  created ") and "published until" in listed[1]
    (entry,) = [entry for entry in audit_entries(app, "signing_key.rotated") if entry["actor"]["kind"] == "cli"]
    assert entry["details"] == {"kid": new_kid, "alg": "RS256", "previous_kid": kid_of(old_token)}


def test_a_replaced_key_is_dropped_once_its_window_has_passed(app, client, cli, rdb, monkeypatch):
    old_token = sign(app)
    monkeypatch.setattr(keys, "PUBLISHED_AFTER_SIGNING_SECONDS", 2)
    new_kid = cli("keys", "rotate").stdout.strip()
    assert published_kids(client) == [new_kid, kid_of(old_token)] and verifies(app, old_token)
    wait_until(lambda: published_kids(client) == [new_kid], timeout=15, message="the old key leaving the JWKS")
    assert not verifies(app, old_token)
    wait_until(lambda: stored_kids(rdb) == {new_kid}, timeout=15, message="the old key deleted from Redis")
    assert verifies(app, sign(app))


def test_retire_removes_a_key_at_once(app, client, cli, make_app, rdb):
    old_token = sign(app)
    other_worker = make_app()
    assert verifies(other_worker, old_token)
    new_kid = cli("keys", "rotate").stdout.strip()
    retired = cli("keys", "retire", kid_of(old_token), "--yes")
    assert retired.returncode == 0, retired.stderr
    assert published_kids(client) == [new_kid]
    assert not verifies(app, old_token)
    wait_until(lambda: not verifies(other_worker, old_token), timeout=10, message="the other app refusing it")
    assert stored_kids(rdb) == {new_kid}
    (entry,) = audit_entries(app, "signing_key.retired")
    assert entry["details"] == {"kid": kid_of(old_token), "alg": "RS256"} and entry["actor"]["kind"] == "cli"


def test_the_key_that_signs_cannot_be_retired_and_unknown_kids_are_refused(app, client, cli, rdb):
    token = sign(app)
    refusals = (
        (kid_of(token), "rotate` first"),
        ("no-such-kid", "no signing key no-such-kid"),
        ("-no-such-kid", "no signing key -no-such-kid"),  # a kid may begin with '-': not an option
    )
    for kid, says in refusals:
        refused = cli("keys", "retire", kid, "--yes")
        assert refused.returncode == 1 and says in refused.stderr and "Traceback" not in refused.stderr
    assert published_kids(client) == [kid_of(token)] and verifies(app, token)
    asked = cli("keys", "retire", kid_of(token))  # no --yes: asked, and no answer is no
    assert asked.returncode == 1 and stored_kids(rdb) == {kid_of(token)}


# Algorithms, as a relying party sees them.


@pytest.mark.parametrize(
    ("algorithm", "key_type"),
    [("RS256", rsa.RSAPublicKey), ("ES256", ec.EllipticCurvePublicKey), ("EdDSA", ed25519.Ed25519PublicKey)],
)
def test_each_algorithm_signs_and_verifies_against_the_published_jwks(make_app, algorithm, key_type):
    app = make_app(OIDC_ID_TOKEN_ALG=algorithm)
    client = https_client(app)
    token = sign(app)
    header = jwt.get_unverified_header(token)
    assert (header["alg"], header["typ"]) == (algorithm, "at+jwt")
    jwks = client.get("/.well-known/jwks.json").get_json()
    (published,) = jwks["keys"]
    assert (published["kid"], published["alg"], published["use"]) == (header["kid"], algorithm, "sig")
    assert published["kid"] == thumbprint(published) and not set(PRIVATE_MEMBERS) & set(published)
    public_key = jwt.PyJWK(published).key
    assert isinstance(public_key, key_type)
    if algorithm == "RS256":
        assert public_key.key_size >= 2048
    if algorithm == "ES256":
        assert public_key.curve.name == "secp256r1"
    assert verify_as_relying_party(jwks, token, algorithm)["sub"] == "user-1"
    assert verifies(app, token)


def test_a_changed_algorithm_signs_from_the_next_rotation(make_app, caplog):
    first = make_app()
    rsa_token = sign(first)
    changed = make_app(OIDC_ID_TOKEN_ALG="ES256")
    with caplog.at_level(logging.WARNING, logger="app.oidc.keys"):
        assert kid_of(sign(changed)) == kid_of(rsa_token)  # the current key signs on
    assert any("keys rotate" in record.getMessage() for record in caplog.records)
    assert run_cli(changed, "keys", "rotate").returncode == 0
    es_token = sign(changed)
    assert jwt.get_unverified_header(es_token)["alg"] == "ES256"
    jwks = https_client(changed).get("/.well-known/jwks.json").get_json()
    assert [key["alg"] for key in jwks["keys"]] == ["ES256", "RS256"]
    assert verify_as_relying_party(jwks, rsa_token, "RS256") and verify_as_relying_party(jwks, es_token, "ES256")


# What `verify` refuses: the flows build on it.


def test_verify_refuses_what_is_not_a_live_token_of_this_provider(app, client):
    good = sign(app)
    assert verifies(app, good)
    public_pem = jwt.PyJWK(client.get("/.well-known/jwks.json").get_json()["keys"][0]).key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    refused = {
        "expired": sign(app, iat=now - 600, exp=now - 300),
        "another issuer": sign(app, iss="https://elsewhere.example"),
        "another audience": sign(app, aud="client-2"),
        "no exp": jwt.encode(
            {k: v for k, v in claims(app).items() if k != "exp"},
            stranger,
            algorithm="RS256",
            headers={"kid": kid_of(good), "typ": "at+jwt"},
        ),
        "another key, our kid": jwt.encode(
            claims(app), stranger, algorithm="RS256", headers={"kid": kid_of(good), "typ": "at+jwt"}
        ),
        "HS256 with the public key": _hmac_token(claims(app), public_pem, kid_of(good)),
        "unknown kid": jwt.encode(claims(app), stranger, algorithm="RS256", headers={"kid": "x", "typ": "at+jwt"}),
        "not a JWT": "not.a.jwt",
    }
    for what, token in refused.items():
        assert not verifies(app, token), what
    with app.app_context(), pytest.raises(keys.TokenInvalid):
        keys.verify(good, typ=None)  # an access token is not an ID token
    with app.app_context():
        id_token = keys.sign(claims(app))
        assert keys.verify(id_token, typ=None, audience="client-1")["sub"] == "user-1"
        with pytest.raises(keys.TokenInvalid):
            keys.verify(id_token, typ="at+jwt", audience="client-1")
        expired = keys.sign(claims(app, iat=now - 600, exp=now - 300))
        assert keys.verify(expired, typ=None, audience="client-1", verify_exp=False)["sub"] == "user-1"


def _hmac_token(payload: dict, secret: bytes, kid: str) -> str:
    """HS256 signed by hand (PyJWT refuses a PEM as an HMAC secret): the algorithm-confusion attack."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = f"{b64(json.dumps({'alg': 'HS256', 'typ': 'at+jwt', 'kid': kid}).encode())}."
    signing_input += b64(json.dumps(payload).encode())
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"
