"""`/admin/issuers`: who may manage issuers, what a PUT accepts and refuses (nothing stored then), what GET shows
(never the secret), DELETE, 404s, the address rules of a JWKS URL, and the audit entries."""

from __future__ import annotations

import pytest

from app.apikeys.store import create_key
from app.auth.users import create_user
from app.redis import Keys
from tests.issuers.conftest import LOOPBACK_KEYS
from tests.issuers.issuer import AUDIENCE, Signer
from tests.utils import DEFAULT_PASSWORD, bearer, random_email, redis_snapshot

MODE_FREE = pytest.mark.not_on_cluster("request checks: the same code whatever the Redis")


def body(**fields) -> dict:
    return {"issuer": "https://tenant.example", "audience": AUDIENCE, "algorithms": ["RS256"], **fields}


def rsa_jwks() -> dict:
    return {"keys": [Signer.rsa().jwk()]}


def test_an_issuer_is_created_read_listed_replaced_and_deleted(client, admin, rdb):
    signer = Signer.ec()
    asked = body(
        issuer="https://a.example/",
        audience="api://a",
        algorithms=["ES256", "ES256"],
        jwks={"keys": [signer.jwk()]},
        channels_claim="rt_channels",
        info_claim="rt_info",
    )
    made = client.put("/admin/issuers/tenant-a", json=asked, headers=admin["headers"])
    assert made.status_code == 200 and made.headers["Cache-Control"] == "no-store"
    shown = made.get_json()
    assert shown == {
        "name": "tenant-a",
        "issuer": "https://a.example/",
        "audience": "api://a",
        "algorithms": ["ES256"],
        "jwks_url": None,
        "jwks": {"keys": [signer.jwk()]},
        "email_claim": "email",
        "channels_claim": "rt_channels",
        "info_claim": "rt_info",
        "created_at": shown["created_at"],
    }
    assert shown["created_at"].endswith("Z")
    assert client.get("/admin/issuers/tenant-a", headers=admin["headers"]).get_json() == shown
    replaced = client.put(
        "/admin/issuers/tenant-a", json=body(secret="s" * 32, algorithms=["HS256"]), headers=admin["headers"]
    )
    assert replaced.status_code == 200
    again = replaced.get_json()
    assert again["jwks"] is None and again["algorithms"] == ["HS256"] and again["created_at"] == shown["created_at"]
    assert "secret" not in again
    client.put("/admin/issuers/b", json=body(jwks=rsa_jwks()), headers=admin["headers"])
    listed = client.get("/admin/issuers", headers=admin["headers"]).get_json()["issuers"]
    assert [issuer["name"] for issuer in listed] == ["b", "tenant-a"]
    assert all("secret" not in issuer for issuer in listed)
    assert client.delete("/admin/issuers/tenant-a", headers=admin["headers"]).status_code == 204
    assert client.get("/admin/issuers/tenant-a", headers=admin["headers"]).status_code == 404
    assert client.delete("/admin/issuers/tenant-a", headers=admin["headers"]).status_code == 404
    assert list(rdb.hkeys(Keys.issuers())) == ["b"]


@MODE_FREE
def test_the_secret_is_never_answered_nor_recorded(client, admin, rdb, audit_entries):
    secret = "a-long-shared-secret-" + "q" * 30
    answer = client.put("/admin/issuers/hmac", json=body(algorithms=["HS256"], secret=secret), headers=admin["headers"])
    assert secret not in answer.get_data(as_text=True)
    for path in ("/admin/issuers", "/admin/issuers/hmac"):
        assert secret not in client.get(path, headers=admin["headers"]).get_data(as_text=True)
    assert secret not in str(audit_entries())


@MODE_FREE
@pytest.mark.parametrize(
    "asked, what",
    [
        (body(), "exactly one"),
        (body(jwks=rsa_jwks(), secret="s" * 40), "exactly one"),
        (body(jwks=rsa_jwks(), jwks_url="https://keys.example/jwks.json"), "exactly one"),
        (body(algorithms=["none"], jwks=rsa_jwks()), "algorithms"),
        (body(algorithms=["RS256", "none"], jwks=rsa_jwks()), "algorithms"),
        (body(algorithms=[], jwks=rsa_jwks()), "algorithms"),
        (body(algorithms=["HS256"], jwks=rsa_jwks()), "secret"),
        (body(algorithms=["RS256", "HS256"], jwks=rsa_jwks()), "secret"),
        (body(algorithms=["HS256"], jwks_url="https://keys.example/jwks.json"), "secret"),
        (body(algorithms=["RS256"], secret="s" * 40), "secret"),
        (body(algorithms=["HS256", "RS256"], secret="s" * 40), "secret"),
        (body(algorithms=["HS256"], secret="s" * 31), "32 bytes"),
        (body(algorithms=["HS384"], secret="s" * 40), "48 bytes"),
        (body(algorithms=["HS512"], secret="s" * 63), "64 bytes"),
        (body(jwks={"keys": [{**Signer.rsa().jwk(), "d": "private"}]}), "private"),
        (body(jwks={"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}), "private or symmetric"),
        (body(jwks={"keys": [{"kty": "RSA", "n": "x"}]}), "usable"),
        (body(jwks={"keys": [{"kty": "XYZ"}]}), "usable"),
        (body(jwks={"keys": []}), "keys"),
        (body(jwks_url="ftp://keys.example/jwks.json"), "jwks_url"),
        (body(jwks_url="not a url"), "jwks_url"),
        (body(jwks=rsa_jwks(), issuer=""), "issuer"),
        (body(jwks=rsa_jwks(), audience=""), "audience"),
        (body(jwks=rsa_jwks(), issuer="https://a.example\n"), "issuer"),
        (body(jwks=rsa_jwks(), email_claim=""), "email_claim"),
    ],
)
def test_a_bad_issuer_is_422_and_nothing_is_stored(client, admin, rdb, asked, what):
    before = redis_snapshot(rdb)
    answer = client.put("/admin/issuers/bad", json=asked, headers=admin["headers"])
    assert answer.status_code == 422, answer.get_json()
    assert answer.get_json()["error"]["code"] == "validation_failed"
    assert what in answer.get_json()["error"]["message"], answer.get_json()
    assert redis_snapshot(rdb) == before


@MODE_FREE
def test_a_short_rsa_key_is_refused(client, admin, rdb):
    from cryptography.hazmat.primitives.asymmetric import rsa

    short = Signer("RS256", rsa.generate_private_key(public_exponent=65537, key_size=1024))  # noqa: S505 - the point
    answer = client.put("/admin/issuers/short", json=body(jwks={"keys": [short.jwk()]}), headers=admin["headers"])
    assert answer.status_code == 422 and "2048" in answer.get_json()["error"]["message"]


@MODE_FREE
@pytest.mark.parametrize("name", ["UPPER", "a" * 33, "with.dot", "with:colon", "ü"])
def test_a_bad_name_is_422_in_put_and_404_elsewhere(client, admin, rdb, name):
    answer = client.put(f"/admin/issuers/{name}", json=body(jwks=rsa_jwks()), headers=admin["headers"])
    assert answer.status_code == 422 and "name" in answer.get_json()["error"]["message"]
    assert client.get(f"/admin/issuers/{name}", headers=admin["headers"]).status_code == 404
    assert client.delete(f"/admin/issuers/{name}", headers=admin["headers"]).status_code == 404
    assert rdb.hlen(Keys.issuers()) == 0


@MODE_FREE
@pytest.mark.parametrize("field", ["issuer", "audience", "algorithms", "jwks", "secret", "channels_claim"])
def test_a_field_of_the_wrong_type_is_400(client, admin, rdb, field):
    wrong = {"issuer": 1, "audience": ["a"], "algorithms": "RS256", "jwks": "keys", "secret": 5, "channels_claim": 3}
    answer = client.put(
        "/admin/issuers/typed", json={**body(jwks=rsa_jwks()), field: wrong[field]}, headers=admin["headers"]
    )
    assert answer.status_code == 400, answer.get_json()
    assert rdb.hlen(Keys.issuers()) == 0


# ---- Who may manage issuers ----


def test_admins_and_keys_with_issuers_manage_may_manage_issuers_and_no_one_else(app, client, auth, admin, rdb):
    with app.app_context():
        manager, _ = create_key("issuers", ["issuers:manage"], [])
        other, _ = create_key("channels", ["channels:manage", "audit:read"], [])
        email = random_email()
        create_user(email, DEFAULT_PASSWORD)
    user = bearer(auth.login_body(email)["access_token"])
    by_key = client.put("/admin/issuers/by-key", json=body(jwks=rsa_jwks()), headers=bearer(manager))
    assert by_key.status_code == 200
    assert client.get("/admin/issuers", headers=bearer(manager)).status_code == 200
    for headers, status in ((bearer(other), 403), (user, 403), ({}, 401), (bearer("ak_" + "x" * 43), 401)):
        for answer in (
            client.put("/admin/issuers/nope", json=body(jwks=rsa_jwks()), headers=headers),
            client.get("/admin/issuers", headers=headers),
            client.get("/admin/issuers/by-key", headers=headers),
            client.delete("/admin/issuers/by-key", headers=headers),
        ):
            assert answer.status_code == status, (headers, answer.get_json())
    assert sorted(rdb.hkeys(Keys.issuers())) == ["by-key"]
    assert client.delete("/admin/issuers/by-key", headers=bearer(manager)).status_code == 204


# ---- The JWKS URL's address ----


@MODE_FREE
def test_a_loopback_or_plain_http_jwks_url_is_refused_without_the_settings(make_app, rdb, key_server):
    from tests.conftest import https_client
    from tests.utils import AuthActions

    strict = https_client(make_app())  # neither WEBHOOK_OUT_ALLOW_HTTP nor WEBHOOK_OUT_ALLOW_PRIVATE
    email = random_email()
    with strict.application.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
    headers = bearer(AuthActions(strict).login_body(email)["access_token"])
    loopback = key_server.publish("/strict.json", Signer.rsa())
    for url, said in (
        (loopback, "https"),
        ("https://127.0.0.1:9/jwks.json", "address"),
        ("https://[::1]/jwks.json", "address"),
        ("https://10.1.2.3/jwks.json", "address"),
        ("https://localhost/jwks.json", "address"),
    ):
        answer = strict.put("/admin/issuers/strict", json=body(jwks_url=url), headers=headers)
        assert answer.status_code == 422, (url, answer.get_json())
        assert said in answer.get_json()["error"]["message"], answer.get_json()
    assert rdb.hlen(Keys.issuers()) == 0
    # With both settings (the fixture's app), the same URL is taken.
    allowed = https_client(make_app(**LOOPBACK_KEYS))
    assert allowed.put("/admin/issuers/strict", json=body(jwks_url=loopback), headers=headers).status_code == 200


# ---- The audit log ----


def test_put_and_delete_are_recorded_with_their_actor_and_never_a_key(client, admin, audit_entries):
    jwks = rsa_jwks()
    client.put("/admin/issuers/audited", json=body(jwks=jwks), headers=admin["headers"])
    client.put("/admin/issuers/audited", json=body(algorithms=["HS256"], secret="z" * 32), headers=admin["headers"])
    client.delete("/admin/issuers/audited", headers=admin["headers"])
    entries = audit_entries("issuer.put") + audit_entries("issuer.deleted")
    by = {"kind": "user", "id": admin["id"]}
    assert [(entry["type"], entry["actor"], entry["details"]) for entry in sorted(entries, key=lambda e: e["id"])] == [
        ("issuer.put", by, {"issuer": "audited", "created": True, "keys": "jwks", "algorithms": ["RS256"]}),
        ("issuer.put", by, {"issuer": "audited", "created": False, "keys": "secret", "algorithms": ["HS256"]}),
        ("issuer.deleted", by, {"issuer": "audited", "users_logged_out": 0}),
    ]
    assert all(entry["ip"] == "127.0.0.1" for entry in entries)
    assert jwks["keys"][0]["n"] not in str(entries)
