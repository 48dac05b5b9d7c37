"""Every rule of a subject token at `POST /oauth/token`: which tokens are accepted (each algorithm, `aud` as
a string or a list, the 60 s leeway), which are refused and how (RFC 6749's shape, no-store, nothing made),
alg confusion, a token presented to an issuer that does not trust it, and the form itself."""

from __future__ import annotations

import json
import time
from urllib.parse import quote

import jwt
import pytest

from app.redis import Keys
from tests.issuers.issuer import ACCESS_TOKEN_TYPE, AUDIENCE, EXCHANGE, JWT_TYPE, Signer, claims, exchange_form
from tests.utils import bearer, redis_snapshot

# The checks of a token are the same code whatever the Redis: the users and sessions they make are tested on
# both modes (test_exchange.py, test_live_exchange.py).
pytestmark = pytest.mark.not_on_cluster("the rules of a token: the same code whatever the Redis")

LEEWAY = 60


def exchanged(client, token: str, **fields):
    return client.post("/oauth/token", data=exchange_form(token, **fields))


def accepted(client, token: str, **fields) -> dict:
    answer = exchanged(client, token, **fields)
    assert answer.status_code == 200, answer.get_json()
    assert answer.headers["Cache-Control"] == "no-store"
    return answer.get_json()


def refused(client, token_or_form, error: str = "invalid_grant", rdb=None, status: int = 400) -> str:
    """The exchange is refused in RFC 6749's shape, with no-store; with `rdb`, nothing is stored but the
    failed login's audit entry (and the rate limiter's counts). Its description."""
    before = _without_audit(redis_snapshot(rdb)) if rdb is not None else None
    form = token_or_form if isinstance(token_or_form, dict) else exchange_form(token_or_form)
    answer = client.post("/oauth/token", data=form)
    assert answer.status_code == status, answer.get_json()
    body = answer.get_json()
    assert set(body) == {"error", "error_description"} and body["error"] == error, body
    assert answer.headers["Cache-Control"] == "no-store" and answer.headers["Pragma"] == "no-cache"
    if rdb is not None:
        assert _without_audit(redis_snapshot(rdb)) == before
    return body["error_description"]


def _without_audit(snapshot: dict) -> dict:
    return {key: value for key, value in snapshot.items() if not key.startswith("audit")}


# ---- Accepted: each kind of key, the claims' rules ----


@pytest.mark.parametrize(
    "make",
    [Signer.rsa, lambda: Signer.rsa("PS256"), Signer.ec, Signer.ed25519],
    ids=["RS256", "PS256", "ES256", "EdDSA"],
)
def test_a_token_signed_with_an_inline_public_key_of_each_kind_is_accepted(client, define, make):
    signer = make()
    name = define(algorithms=[signer.algorithm], jwks={"keys": [signer.jwk()]})
    answer = accepted(client, signer.sign(claims(f"https://{name}.example", "someone")))
    assert answer["issued_token_type"] == ACCESS_TOKEN_TYPE
    assert answer["user"]["external"] == {"issuer": name, "sub": "someone"}


@pytest.mark.parametrize("algorithm, size", [("HS256", 32), ("HS384", 48), ("HS512", 64)])
def test_a_token_signed_with_the_issuers_secret_is_accepted(client, define, algorithm, size):
    signer = Signer.hmac(algorithm, size)
    name = define(algorithms=[algorithm], secret=signer.private)
    assert accepted(client, signer.sign(claims(f"https://{name}.example"), kid=False))["token_type"] == "Bearer"


def test_keys_fetched_from_the_issuers_jwks_url_verify_its_tokens(client, define, key_server):
    rsa, ec, ed = Signer.rsa(), Signer.ec(), Signer.ed25519()
    url = key_server.publish("/three.json", rsa, ec, ed)
    name = define(algorithms=["RS256", "ES256", "EdDSA"], jwks_url=url)
    for signer in (rsa, ec, ed):
        accepted(client, signer.sign(claims(f"https://{name}.example")))


def test_aud_may_be_the_audience_or_a_list_holding_it(client, rsa_issuer):
    _, iss, signer = rsa_issuer
    accepted(client, signer.sign(claims(iss, audience=AUDIENCE)))
    accepted(client, signer.sign(claims(iss, audience=["another-api", AUDIENCE])))
    refused(client, signer.sign(claims(iss, audience="another-api")))
    refused(client, signer.sign(claims(iss, audience=["another-api", "a-third"])))
    refused(client, signer.sign(claims(iss, audience=[])))


def test_clocks_may_differ_by_a_minute_either_way(client, rsa_issuer):
    _, iss, signer = rsa_issuer
    now = int(time.time())
    # Expired up to a minute ago, or not valid for up to a minute yet: another clock's view.
    accepted(client, signer.sign(claims(iss, exp=now - LEEWAY + 10)))
    accepted(client, signer.sign(claims(iss, nbf=now + LEEWAY - 10)))
    accepted(client, signer.sign(claims(iss, iat=now + LEEWAY - 10)))
    # Beyond the minute: refused.
    assert "expired" in refused(client, signer.sign(claims(iss, exp=now - LEEWAY - 10)))
    assert "nbf or iat" in refused(client, signer.sign(claims(iss, nbf=now + LEEWAY + 30)))
    assert "nbf or iat" in refused(client, signer.sign(claims(iss, iat=now + LEEWAY + 30)))


# ---- Refused, and nothing made ----


def test_each_missing_or_wrong_claim_is_refused_with_invalid_grant_and_makes_nothing(client, rsa_issuer, rdb):
    _, iss, signer = rsa_issuer
    good = claims(iss, "carol")
    for claim in ("exp", "iss", "aud", "sub"):
        without = {name: value for name, value in good.items() if name != claim}
        assert claim in refused(client, signer.sign(without), rdb=rdb)
    for wrong in (
        {"iss": iss + "/other"},  # another issuer's name
        {"sub": ""},
        {"sub": 42},
        {"sub": ["carol"]},
        {"sub": "carol\n"},
        {"exp": "tomorrow"},
    ):
        refused(client, signer.sign({**good, **wrong}), rdb=rdb)
    accepted(client, signer.sign(good))  # the path accepts the token these came from


def test_a_bad_signature_another_key_or_garbage_is_refused(client, rsa_issuer, rdb):
    _, iss, signer = rsa_issuer
    token = signer.sign(claims(iss))
    header, payload, signature = token.split(".")
    forged = json.loads(jwt.utils.base64url_decode(payload))
    forged["sub"] = "someone-else"
    tampered = ".".join([header, jwt.utils.base64url_encode(json.dumps(forged).encode()).decode(), signature])
    assert "signature" in refused(client, tampered, rdb=rdb)
    impostor = Signer.rsa()
    impostor.kid = signer.kid  # the right kid, the wrong key
    assert "signature" in refused(client, impostor.sign(claims(iss)), rdb=rdb)
    for garbage in ("not-a-jwt", "a.b.c", token.split(".")[0] + "..", "x" * 5000):
        refused(client, garbage, rdb=rdb)


def test_alg_none_is_refused(client, rsa_issuer, rdb):
    _, iss, signer = rsa_issuer
    unsigned = jwt.encode(claims(iss), None, algorithm="none", headers={"kid": signer.kid})
    assert "algorithm" in refused(client, unsigned, rdb=rdb)


def test_alg_confusion_an_hs256_token_keyed_with_the_rsa_issuers_public_key_is_refused(client, rsa_issuer, rdb):
    """The classic attack: the issuer's public key (anyone may have it) used as an HMAC secret."""
    _, iss, signer = rsa_issuer
    pem = signer.public_pem()
    jwk_as_secret = json.dumps(signer.jwk()).encode()
    for key in (pem, jwk_as_secret):
        # PyJWT's own encoder refuses a PEM as an HMAC key, so the token is made as an attacker would: by hand.
        forged = _hs256_by_hand(claims(iss, "admin"), key, signer.kid)
        assert jwt.get_unverified_header(forged) == {"alg": "HS256", "typ": "JWT", "kid": signer.kid}
        assert "algorithm" in refused(client, forged, rdb=rdb)


def _hs256_by_hand(payload: dict, key: bytes, kid: str) -> str:
    import hashlib
    import hmac

    encode = jwt.utils.base64url_encode
    header = encode(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    body = encode(json.dumps(payload).encode())
    signature = hmac.new(key, header + b"." + body, hashlib.sha256).digest()
    return (header + b"." + body + b"." + encode(signature)).decode()


def test_an_algorithm_the_issuer_does_not_use_is_refused_even_with_the_right_key(client, define, rdb):
    signer = Signer.rsa()
    name = define(algorithms=["RS256"], jwks={"keys": [signer.jwk()]})
    other_algorithm = signer.sign(claims(f"https://{name}.example"), algorithm="RS512")
    assert "algorithm" in refused(client, other_algorithm, rdb=rdb)
    # A key marked for one algorithm verifies only that one, whatever the issuer allows.
    pinned = Signer.rsa()
    name = define(algorithms=["RS256", "RS512"], jwks={"keys": [pinned.jwk(alg="RS256")]})
    assert "another algorithm" in refused(client, pinned.sign(claims(f"https://{name}.example"), algorithm="RS512"))
    accepted(client, pinned.sign(claims(f"https://{name}.example")))


def test_a_secret_issuer_refuses_asymmetric_tokens_and_a_key_issuer_symmetric_ones(client, define, rsa_issuer):
    hmac = Signer.hmac()
    name = define(algorithms=["HS256"], secret=hmac.private)
    rsa = Signer.rsa()
    refused(client, rsa.sign(claims(f"https://{name}.example")))
    # An HS256 token made with some secret, to the RSA issuer: never verified as HMAC at all.
    _, iss, _ = rsa_issuer
    refused(client, hmac.sign(claims(iss), kid=False))


def test_a_token_of_one_issuer_is_refused_when_only_another_issuer_trusts_its_iss(client, define, rdb):
    alpha, beta = Signer.rsa(), Signer.ec()
    name_a = define(algorithms=["RS256"], jwks={"keys": [alpha.jwk()]})
    name_b = define(algorithms=["ES256"], jwks={"keys": [beta.jwk()]})
    # Signed with alpha's key but naming beta as its issuer: beta's keys do not verify it.
    assert refused(client, alpha.sign(claims(f"https://{name_b}.example")), rdb=rdb)
    assert refused(client, beta.sign(claims(f"https://{name_a}.example")), rdb=rdb)
    # An iss no issuer has.
    assert "iss" in refused(client, alpha.sign(claims("https://nobody.example")), rdb=rdb)
    # Two issuers with one iss (one tenant, two audiences): each token is verified by the keys of its own.
    gamma = Signer.ed25519()
    shared = f"https://{name_a}.example"
    name_c = define(issuer=shared, audience="second-api", algorithms=["EdDSA"], jwks={"keys": [gamma.jwk()]})
    assert (
        accepted(client, gamma.sign(claims(shared, "u1", audience="second-api")))["user"]["external"]["issuer"]
        == name_c
    )
    assert accepted(client, alpha.sign(claims(shared, "u1")))["user"]["external"]["issuer"] == name_a


def test_an_unknown_kid_or_no_kid_among_several_keys_is_refused(client, define, rdb):
    first, second = Signer.rsa(), Signer.rsa()
    name = define(algorithms=["RS256"], jwks={"keys": [first.jwk(), second.jwk()]})
    iss = f"https://{name}.example"
    assert "kid" in refused(client, first.sign(claims(iss), kid="nobody-has-it"), rdb=rdb)
    assert "kid" in refused(client, first.sign(claims(iss), kid=False), rdb=rdb)
    accepted(client, second.sign(claims(iss)))
    # With one key only, a token without a kid is verified by it.
    lone = Signer.ec()
    name = define(algorithms=["ES256"], jwks={"keys": [lone.jwk()]})
    accepted(client, lone.sign(claims(f"https://{name}.example"), kid=False))


# ---- The form ----


def test_a_missing_field_or_an_unknown_token_type_is_invalid_request(client, rsa_issuer, rdb):
    _, iss, signer = rsa_issuer
    token = signer.sign(claims(iss))
    for form in (
        {"subject_token": token, "subject_token_type": JWT_TYPE},  # no grant_type
        {"grant_type": EXCHANGE, "subject_token_type": JWT_TYPE},
        {"grant_type": EXCHANGE, "subject_token": token},
        {"grant_type": EXCHANGE, "subject_token": "", "subject_token_type": JWT_TYPE},
        exchange_form(token, subject_token_type="urn:ietf:params:oauth:token-type:saml2"),
        exchange_form(token, subject_token_type="jwt"),
        exchange_form(token, transport="header"),
        exchange_form(token, requested_token_type="urn:ietf:params:oauth:token-type:refresh_token"),
        exchange_form(token, actor_token=token, actor_token_type=JWT_TYPE),
        exchange_form(token, device="a\nphone"),
    ):
        refused(client, form, "invalid_request", rdb=rdb)
    twice_form = "&".join(
        f"{name}={quote(value)}" for name, value in [*exchange_form(token).items(), ("subject_token", token)]
    )
    twice = client.post("/oauth/token", data=twice_form, content_type="application/x-www-form-urlencoded")
    assert twice.status_code == 400 and twice.get_json()["error"] == "invalid_request"
    for token_type in (JWT_TYPE, ACCESS_TOKEN_TYPE, "urn:ietf:params:oauth:token-type:id_token"):
        accepted(client, token, subject_token_type=token_type)


def test_parameters_come_from_the_form_body_only(client, rsa_issuer, rdb):
    _, iss, signer = rsa_issuer
    token = signer.sign(claims(iss))
    as_json = client.post("/oauth/token", json=exchange_form(token))
    assert as_json.status_code == 400 and as_json.get_json()["error"] == "invalid_request"
    in_the_url = client.post("/oauth/token", query_string=exchange_form(token), data={})
    assert in_the_url.status_code == 400 and in_the_url.get_json()["error"] == "invalid_request"
    unknown = client.post("/oauth/token", data=exchange_form(token, grant_type="password"))
    assert unknown.status_code == 400 and unknown.get_json()["error"] == "unsupported_grant_type"
    huge = client.post("/oauth/token", data=exchange_form("x" * 70_000))
    assert huge.status_code == 413 and huge.get_json()["error"] == "payload_too_large"
    assert huge.headers["Cache-Control"] == "no-store"


def test_a_token_exchange_answer_is_t_with_issued_token_type(client, rsa_issuer):
    _, iss, signer = rsa_issuer
    answer = accepted(client, signer.sign(claims(iss, "dave")), device="dave's phone")
    assert set(answer) == {
        "access_token", "refresh_token", "token_type", "expires_in", "refresh_expires_in", "session_id", "user",
        "issued_token_type",
    }  # fmt: skip
    assert answer["token_type"] == "Bearer" and answer["expires_in"] == 900
    me = client.get("/auth/me", headers=bearer(answer["access_token"])).get_json()
    assert me == {"user": answer["user"], "session_id": answer["session_id"]}
    sessions = client.get("/auth/sessions", headers=bearer(answer["access_token"])).get_json()["sessions"]
    assert [session["device"] for session in sessions] == ["dave's phone"]


def test_an_issuers_record_is_read_at_every_exchange(client, define, rdb, admin):
    """A replaced or deleted issuer applies to the next exchange (no record is kept in a process)."""
    old, new = Signer.rsa(), Signer.rsa()
    name = define(algorithms=["RS256"], jwks={"keys": [old.jwk()]})
    iss = f"https://{name}.example"
    accepted(client, old.sign(claims(iss)))
    define(name, algorithms=["RS256"], jwks={"keys": [new.jwk()]})
    refused(client, old.sign(claims(iss)))
    accepted(client, new.sign(claims(iss)))
    assert client.delete(f"/admin/issuers/{name}", headers=admin["headers"]).status_code == 204
    assert "iss" in refused(client, new.sign(claims(iss)))
    assert rdb.hget(Keys.issuers(), name) is None


def test_the_token_endpoint_refuses_plain_http_but_from_loopback(client, rsa_issuer):
    """OAuth's rule (RFC 6749, 1.6), as Authlib applies it: a proxy in front must say the request came over TLS."""
    _, iss, signer = rsa_issuer
    form = exchange_form(signer.sign(claims(iss)))
    plain = client.post("/oauth/token", data=form, base_url="http://service.example")
    assert plain.status_code == 400 and plain.get_json()["error"] == "insecure_transport"
    assert plain.headers["Cache-Control"] == "no-store"
    assert client.post("/oauth/token", data=form, base_url="http://127.0.0.1").status_code == 200
    assert client.post("/oauth/token", data=form, base_url="https://service.example").status_code == 200
