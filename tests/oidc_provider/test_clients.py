"""The OpenID provider's client registry: `/admin/oauth-clients` and `flask --app wsgi clients ...`. What a client
may be registered with (and what is refused, storing nothing), its secret shown once and kept as a hash only,
rotation, PATCH, deletion (gone at once, the signal sent), who may manage clients, the audit entries, and the
client model Authlib's authorization server uses."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from app.apikeys.store import create_key
from app.auth.users import create_user
from app.oidc import clients
from app.redis import Keys
from tests.conftest import https_client
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer, random_email, redis_snapshot

MODE_FREE = pytest.mark.not_on_cluster("request checks: the same code whatever the Redis")
BASE = "/admin/oauth-clients"
CLIENT_ID = re.compile(r"cl_[0-9a-f]{32}")
SECRET = re.compile(r"cs_[A-Za-z0-9_-]{43}")
# The test's back-channel receiver would be on loopback, over plain HTTP: allowed only with both settings.
LOOPBACK_ALLOWED = {"WEBHOOK_OUT_ALLOW_HTTP": "true", "WEBHOOK_OUT_ALLOW_PRIVATE": "true"}
UNKNOWN_ID = "cl_" + "0" * 32


def web_app(**fields) -> dict:
    return {"name": "Web shop", "type": "confidential", "redirect_uris": ["https://shop.example/callback"], **fields}


def mobile_app(**fields) -> dict:
    return {"name": "Phone app", "type": "public", "redirect_uris": ["com.example.app:/oauth/cb"], **fields}


@pytest.fixture
def admin(app, auth):
    """An administrator, signed in (body transport): its id and a bearer header."""
    email = random_email()
    with app.app_context():
        user = create_user(email, DEFAULT_PASSWORD, role="admin")
    return {"id": user["id"], "headers": bearer(auth.login_body(email)["access_token"])}


@pytest.fixture
def manager_key(app):
    """An API key with scope clients:manage: its id and a bearer header."""
    with app.app_context():
        raw, key = create_key("client manager", ["clients:manage"], [])
    return {"id": key["id"], "headers": bearer(raw)}


@pytest.fixture
def register(client, admin):
    """Register a client as the administrator; the 201 answer."""

    def post(body: dict) -> dict:
        answer = client.post(BASE, json=body, headers=admin["headers"])
        assert answer.status_code == 201, answer.get_json()
        return answer.get_json()

    return post


@pytest.fixture
def entries(client, admin):
    """The audit entries of a type, newest first, as GET /admin/audit answers them."""

    def read(entry_type: str) -> list[dict]:
        answer = client.get("/admin/audit", query_string={"type": entry_type}, headers=admin["headers"])
        assert answer.status_code == 200, answer.get_json()
        return answer.get_json()["entries"]

    return read


def stored_records(rdb) -> dict:
    return {client_id: json.loads(record) for client_id, record in rdb.hgetall(Keys.oauth_clients()).items()}


# ---- Registering, reading, listing; the secret ----


def test_a_confidential_client_is_registered_its_secret_shown_once_and_kept_as_a_hash(client, admin, rdb, register):
    answer = client.post(BASE, json=web_app(), headers=admin["headers"])
    assert answer.status_code == 201 and answer.headers["Cache-Control"] == "no-store"
    made = answer.get_json()
    secret = made.pop("client_secret")
    assert SECRET.fullmatch(secret) and CLIENT_ID.fullmatch(made["client_id"])
    assert made == {
        "client_id": made["client_id"],
        "name": "Web shop",
        "type": "confidential",
        "redirect_uris": ["https://shop.example/callback"],
        "grant_types": ["authorization_code", "refresh_token"],
        "scopes": ["openid"],
        "post_logout_redirect_uris": [],
        "backchannel_logout_uri": None,
        "first_party": False,
        "audience": made["client_id"],
        "created_at": made["created_at"],
    }
    assert made["created_at"].endswith("Z")

    # Only the secret's SHA-256 is in Redis; the secret itself is nowhere, and never answered again.
    record = stored_records(rdb)[made["client_id"]]
    assert record["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in json.dumps(redis_snapshot(rdb))
    shown = client.get(f"{BASE}/{made['client_id']}", headers=admin["headers"])
    assert shown.status_code == 200 and shown.get_json() == made
    listed = client.get(BASE, headers=admin["headers"])
    assert listed.get_json() == {"clients": [made]}
    for answer in (shown, listed):
        assert secret not in answer.get_data(as_text=True) and "secret" not in answer.get_data(as_text=True)

    other = register(mobile_app())
    assert [c["client_id"] for c in client.get(BASE, headers=admin["headers"]).get_json()["clients"]] == [
        made["client_id"],
        other["client_id"],
    ]  # oldest first
    with client.application.app_context():
        found = clients.get_client(made["client_id"])
    assert found.check_client_secret(secret)
    assert not found.check_client_secret(secret[:-1]) and not found.check_client_secret("")
    assert secret not in repr(found)


def test_a_public_client_has_no_secret_and_every_setting_is_kept(client, admin, rdb, register):
    asked = mobile_app(
        redirect_uris=["com.example.app:/oauth/cb", "http://127.0.0.1:8765/cb", "http://[::1]/cb"],
        grant_types=["refresh_token", "authorization_code"],
        scopes=["profile", "openid", "offline_access", "events", "openid"],
        post_logout_redirect_uris=["com.example.app:/logged-out", "https://example.com/bye?x=1"],
        first_party=True,
        audience="https://api.example.com",
    )
    answer = client.post(BASE, json=asked, headers=admin["headers"])
    assert answer.status_code == 201, answer.get_json()
    made = answer.get_json()
    assert "client_secret" not in made
    assert made["redirect_uris"] == asked["redirect_uris"]
    assert made["grant_types"] == ["authorization_code", "refresh_token"]
    assert made["scopes"] == ["openid", "profile", "offline_access", "events"]
    assert made["post_logout_redirect_uris"] == asked["post_logout_redirect_uris"]
    assert made["first_party"] is True and made["audience"] == "https://api.example.com"
    assert stored_records(rdb)[made["client_id"]]["secret_hash"] is None


# ---- What is refused ----


@MODE_FREE
@pytest.mark.parametrize(
    "asked, what",
    [
        (web_app(redirect_uris=["https://shop.example/cb#frag"]), "fragment"),
        (web_app(redirect_uris=["https://shop.example/cb#"]), "fragment"),
        (web_app(redirect_uris=["http://shop.example/cb"]), "loopback"),
        (web_app(redirect_uris=["HTTP://shop.example/cb"]), "loopback"),
        (web_app(redirect_uris=["http://localhost.evil.example/cb"]), "loopback"),
        (web_app(redirect_uris=["http://127.0.0.2/cb"]), "loopback"),
        (web_app(redirect_uris=["http://127.1/cb"]), "loopback"),
        (web_app(redirect_uris=["https://user:pass@shop.example/cb"]), "user name"),
        (web_app(redirect_uris=["http://127.0.0.1@evil.example/cb"]), "user name"),
        (web_app(redirect_uris=["javascript:alert(1)"]), "private-use"),
        (mobile_app(redirect_uris=["javascript:alert(1)//x.y"]), "private-use"),
        (mobile_app(redirect_uris=["data:text/html,hi"]), "private-use"),
        (web_app(redirect_uris=["com.example.app:/cb"]), "public clients"),
        (mobile_app(redirect_uris=["com.example.app:"]), "no path"),
        (web_app(redirect_uris=["/callback"]), "absolute"),
        (web_app(redirect_uris=["shop.example/callback"]), "absolute"),
        (web_app(redirect_uris=["https:///callback"]), "no host"),
        (web_app(redirect_uris=["https://shop.example/a b"]), "space"),
        (web_app(redirect_uris=[]), "at least one"),
        (web_app(redirect_uris=[""]), "redirect_uris"),
        (web_app(redirect_uris=[f"https://shop.example/{n}" for n in range(21)]), "redirect_uris"),
        (web_app(post_logout_redirect_uris=["https://shop.example/bye#x"]), "post_logout_redirect_uris"),
        (web_app(post_logout_redirect_uris=["http://shop.example/bye"]), "post_logout_redirect_uris"),
        (web_app(post_logout_redirect_uris=["com.example.app:/bye"]), "post_logout_redirect_uris"),
        (web_app(scopes=["admin"]), "scopes"),
        (web_app(scopes=[]), "scopes"),
        (web_app(scopes=["openid", "offline"]), "scopes"),
        (web_app(grant_types=["implicit"]), "grant_types"),
        (web_app(grant_types=["password"]), "grant_types"),
        (web_app(grant_types=[]), "grant_types"),
        (mobile_app(grant_types=["client_credentials"]), "client_credentials"),
        (mobile_app(grant_types=["authorization_code", "client_credentials"]), "client_credentials"),
        (web_app(type="service"), "type"),
        (web_app(name=""), "name"),
        (web_app(name="   "), "name"),
        (web_app(name="a" * 101), "name"),
        (web_app(name="Shop\x1b[31m"), "name"),
        (web_app(audience=""), "audience"),
        (web_app(audience="api\n"), "audience"),
        (web_app(backchannel_logout_uri="http://127.0.0.1:9/logout"), "backchannel_logout_uri"),
        (web_app(backchannel_logout_uri="https://127.0.0.1/logout"), "backchannel_logout_uri"),
        (web_app(backchannel_logout_uri="https://shop.example/logout#x"), "backchannel_logout_uri"),
        (web_app(backchannel_logout_uri="not a url"), "backchannel_logout_uri"),
    ],
)
def test_a_bad_client_is_422_and_nothing_is_stored(client, admin, rdb, asked, what):
    before = redis_snapshot(rdb)
    answer = client.post(BASE, json=asked, headers=admin["headers"])
    assert answer.status_code == 422, answer.get_json()
    assert answer.get_json()["error"]["code"] == "validation_failed"
    assert what in answer.get_json()["error"]["message"], answer.get_json()
    assert redis_snapshot(rdb) == before


@MODE_FREE
@pytest.mark.parametrize(
    "asked",
    [
        {"type": "confidential", "redirect_uris": ["https://a.example/cb"]},
        {"name": "x", "redirect_uris": ["https://a.example/cb"]},
        {"name": "x", "type": "public"},
        web_app(redirect_uris="https://a.example/cb"),
        web_app(redirect_uris=[1]),
        web_app(first_party="yes"),
        web_app(scopes="openid"),
        web_app(name=7),
    ],
)
def test_a_malformed_client_is_400_and_nothing_is_stored(client, admin, rdb, asked):
    before = redis_snapshot(rdb)
    answer = client.post(BASE, json=asked, headers=admin["headers"])
    assert answer.status_code == 400, answer.get_json()
    assert answer.get_json()["error"]["code"] == "bad_request"
    assert redis_snapshot(rdb) == before


@pytest.fixture
def loopback_client(make_app):
    """A test client of an app that allows outgoing webhooks (and so back-channel logout) to loopback over http."""
    return https_client(make_app(**LOOPBACK_ALLOWED))


def test_a_backchannel_uri_follows_the_outgoing_webhooks_address_rules(client, admin, rdb, loopback_client):
    loopback = "http://127.0.0.1:8080/backchannel-logout"
    refused = client.post(BASE, json=web_app(backchannel_logout_uri=loopback), headers=admin["headers"])
    assert refused.status_code == 422 and "WEBHOOK_OUT_ALLOW_HTTP" in refused.get_json()["error"]["message"]
    refused = client.post(BASE, json=web_app(backchannel_logout_uri="https://[::1]/logout"), headers=admin["headers"])
    assert refused.status_code == 422 and "WEBHOOK_OUT_ALLOW_PRIVATE" in refused.get_json()["error"]["message"]
    assert rdb.hlen(Keys.oauth_clients()) == 0

    accepted = loopback_client.post(BASE, json=web_app(backchannel_logout_uri=loopback), headers=admin["headers"])
    assert accepted.status_code == 201, accepted.get_json()
    made = accepted.get_json()
    assert made["backchannel_logout_uri"] == loopback
    # Changed later: the same rules (here, where loopback is refused, it cannot be set again or moved).
    path = f"{BASE}/{made['client_id']}"
    moved = client.patch(path, json={"backchannel_logout_uri": "http://127.0.0.1:8081/x"}, headers=admin["headers"])
    assert moved.status_code == 422
    kept = client.patch(path, json={"name": "Renamed"}, headers=admin["headers"])  # untouched: not checked again
    assert kept.status_code == 200 and kept.get_json()["backchannel_logout_uri"] == loopback
    cleared = client.patch(path, json={"backchannel_logout_uri": None}, headers=admin["headers"])
    assert cleared.status_code == 200 and cleared.get_json()["backchannel_logout_uri"] is None


# ---- Rotating the secret ----


def test_rotating_the_secret_ends_the_old_one_at_once(client, admin, app, register, entries):
    made = register(web_app())
    old = made["client_secret"]
    answer = client.post(f"{BASE}/{made['client_id']}/rotate-secret", headers=admin["headers"])
    assert answer.status_code == 200 and answer.headers["Cache-Control"] == "no-store"
    assert list(answer.get_json()) == ["client_secret"]
    new = answer.get_json()["client_secret"]
    assert SECRET.fullmatch(new) and new != old
    with app.app_context():
        found = clients.get_client(made["client_id"])
    assert found.check_client_secret(new) and not found.check_client_secret(old)
    shown = client.get(f"{BASE}/{made['client_id']}", headers=admin["headers"]).get_json()
    assert shown == {key: value for key, value in made.items() if key != "client_secret"}  # nothing else changed

    rotated = entries("oauth_client.updated")[0]
    assert rotated["details"] == {
        "client_id": made["client_id"],
        "name": "Web shop",
        "type": "confidential",
        "changed": ["secret"],
    }
    assert rotated["actor"] == {"kind": "user", "id": admin["id"]}


def test_a_public_client_has_no_secret_to_rotate(client, admin, register):
    made = register(mobile_app())
    answer = client.post(f"{BASE}/{made['client_id']}/rotate-secret", headers=admin["headers"])
    assert answer.status_code == 409 and answer.get_json()["error"]["code"] == "conflict"


def test_a_change_made_while_a_patch_runs_is_not_lost(app, rdb, monkeypatch):
    """A rotation lands between a PATCH's reading of the client and its writing: the PATCH is made again on
    what is stored then, so the new secret stays (a plain read-modify-write would put the old hash back)."""
    with app.app_context():
        made, old = clients.create_client(clients.OAuthClient("", "Racing", "confidential", ("https://a.example/cb",)))
    rotated = []
    check_client = clients.check_client

    def rotate_meanwhile(client):
        if not rotated:
            rotated.append(clients.rotate_secret(made.client_id))
        return check_client(client)

    monkeypatch.setattr(clients, "check_client", rotate_meanwhile)
    with app.app_context():
        renamed = clients.update_client(made.client_id, {"name": "Racing on"})
        final = clients.get_client(made.client_id)
    assert renamed.name == final.name == "Racing on"
    assert final.check_client_secret(rotated[0]) and not final.check_client_secret(old)


# ---- PATCH ----


def test_a_patch_changes_only_what_it_names_under_the_same_rules(client, admin, rdb, register, entries):
    made = register(mobile_app(scopes=["openid", "email"]))
    path = f"{BASE}/{made['client_id']}"
    made_record = {key: value for key, value in made.items()}

    changed = client.patch(
        path,
        json={"name": "Phone app 2", "redirect_uris": ["com.example.app:/cb2"], "scopes": ["openid", "email"]},
        headers=admin["headers"],
    )
    assert changed.status_code == 200 and changed.headers["Cache-Control"] == "no-store"
    assert changed.get_json() == {**made_record, "name": "Phone app 2", "redirect_uris": ["com.example.app:/cb2"]}
    entry = entries("oauth_client.updated")[0]
    assert entry["details"] == {
        "client_id": made["client_id"],
        "name": "Phone app 2",
        "type": "public",
        "changed": ["name", "redirect_uris"],  # scopes were given, but as they were
    }

    audience = client.patch(path, json={"audience": "api://phone"}, headers=admin["headers"]).get_json()["audience"]
    assert audience == "api://phone"
    reset = client.patch(path, json={"audience": None}, headers=admin["headers"])
    assert reset.status_code == 200 and reset.get_json()["audience"] == made["client_id"]

    nothing = client.patch(path, json={"first_party": False}, headers=admin["headers"])
    assert nothing.status_code == 200
    assert len(entries("oauth_client.updated")) == 3  # a change to nothing records nothing

    before = redis_snapshot(rdb)
    for body, status, what in [
        ({"redirect_uris": ["com.example.app:/cb#x"]}, 422, "fragment"),
        ({"redirect_uris": []}, 422, "at least one"),
        ({"grant_types": ["client_credentials"]}, 422, "client_credentials"),
        ({"post_logout_redirect_uris": ["http://shop.example/"]}, 422, "loopback"),
        ({"scopes": ["openid", "root"]}, 422, "scopes"),
        ({"type": "confidential"}, 422, "type"),
        ({"name": ""}, 422, "name"),
        ({"name": None}, 400, "name"),
        ({"redirect_uris": None}, 400, "redirect_uris"),
        ({"first_party": "true"}, 400, "first_party"),
    ]:
        answer = client.patch(path, json=body, headers=admin["headers"])
        assert answer.status_code == status, (body, answer.get_json())
        assert what in answer.get_json()["error"]["message"], (body, answer.get_json())
    assert redis_snapshot(rdb) == before
    assert client.patch(path, json={"type": "public"}, headers=admin["headers"]).status_code == 200  # the same type


def test_a_confidential_client_may_become_a_backend_with_client_credentials(client, admin, register):
    made = register(web_app())
    path = f"{BASE}/{made['client_id']}"
    backend = {"grant_types": ["client_credentials"], "redirect_uris": []}
    answer = client.patch(path, json=backend, headers=admin["headers"])
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["grant_types"] == ["client_credentials"] and answer.get_json()["redirect_uris"] == []
    backend = client.post(
        BASE,
        json={"name": "Billing", "type": "confidential", "redirect_uris": [], "grant_types": ["client_credentials"]},
        headers=admin["headers"],
    )
    assert backend.status_code == 201 and backend.get_json()["client_secret"]


# ---- DELETE ----


def test_a_deleted_client_is_gone_at_once_and_the_signal_is_sent(client, admin, app, rdb, register, entries):
    made = register(web_app())
    kept = register(mobile_app())
    sent = []

    def receive(sender, **details):
        sent.append((sender, details))

    with clients.client_deleted.connected_to(receive):
        answer = client.delete(f"{BASE}/{made['client_id']}", headers=admin["headers"])
        assert answer.status_code == 204
        assert len(sent) == 1
        sender, details = sent[0]
        assert sender is app and details["client_id"] == made["client_id"]
        assert details["client"].backchannel_logout_uri is None and details["client"].name == "Web shop"
        with app.app_context():
            assert clients.get_client(made["client_id"]) is None  # its tokens fail wherever it is looked up
            assert clients.get_client(kept["client_id"]) is not None
        assert client.get(f"{BASE}/{made['client_id']}", headers=admin["headers"]).status_code == 404
        assert client.delete(f"{BASE}/{made['client_id']}", headers=admin["headers"]).status_code == 404
        assert client.post(f"{BASE}/{made['client_id']}/rotate-secret", headers=admin["headers"]).status_code == 404
        assert len(sent) == 1  # a delete of nothing sends nothing
    assert list(rdb.hkeys(Keys.oauth_clients())) == [kept["client_id"]]
    entry = entries("oauth_client.deleted")[0]
    assert entry["details"] == {"client_id": made["client_id"], "name": "Web shop", "type": "confidential"}
    assert entry["actor"] == {"kind": "user", "id": admin["id"]}


@MODE_FREE
@pytest.mark.parametrize("client_id", [UNKNOWN_ID, "cl_123", "CL_" + "0" * 32, "x" * 300, "cl_" + "g" * 32])
def test_an_unknown_or_misshapen_id_is_404(client, admin, rdb, client_id):
    headers = admin["headers"]
    assert client.get(f"{BASE}/{client_id}", headers=headers).status_code == 404
    assert client.patch(f"{BASE}/{client_id}", json={"name": "x"}, headers=headers).status_code == 404
    assert client.delete(f"{BASE}/{client_id}", headers=headers).status_code == 404
    assert client.post(f"{BASE}/{client_id}/rotate-secret", headers=headers).status_code == 404


# ---- Who may manage clients ----


def test_administrators_and_keys_with_clients_manage_manage_clients_and_nobody_else(client, app, manager_key, entries):
    with app.app_context():
        other_key, _ = create_key("publisher", ["events:publish", "issuers:manage"], ["*"])
    user = AuthActions(client).new_user_tokens()
    made = client.post(BASE, json=web_app(), headers=manager_key["headers"])
    assert made.status_code == 201
    client_id = made.get_json()["client_id"]
    path = f"{BASE}/{client_id}"
    calls = [
        ("post", BASE, web_app()),
        ("get", BASE, None),
        ("get", path, None),
        ("patch", path, {"name": "x"}),
        ("post", f"{path}/rotate-secret", None),
        ("delete", path, None),
    ]
    for method, url, body in calls:
        kwargs = {"json": body} if body is not None else {}
        assert getattr(client, method)(url, **kwargs).status_code == 401
        assert getattr(client, method)(url, headers=bearer(user["access_token"]), **kwargs).status_code == 403
        assert getattr(client, method)(url, headers=bearer(other_key), **kwargs).status_code == 403
    for method, url, body in calls:
        kwargs = {"json": body} if body is not None else {}
        answer = getattr(client, method)(url, headers=manager_key["headers"], **kwargs)
        assert answer.status_code in (200, 201, 204), (method, url, answer.get_json())
    for entry_type in ("oauth_client.created", "oauth_client.updated", "oauth_client.deleted"):
        assert entries(entry_type)[0]["actor"] == {"kind": "api_key", "id": manager_key["id"]}


# ---- The audit log never holds a secret ----


def test_no_audit_entry_holds_a_secret(client, admin, register, entries):
    made = register(web_app())
    rotated = client.post(f"{BASE}/{made['client_id']}/rotate-secret", headers=admin["headers"]).get_json()
    client.delete(f"{BASE}/{made['client_id']}", headers=admin["headers"])
    created = entries("oauth_client.created")[0]
    assert created["details"] == {"client_id": made["client_id"], "name": "Web shop", "type": "confidential"}
    assert created["ip"]
    every = json.dumps([entries(t) for t in ("oauth_client.created", "oauth_client.updated", "oauth_client.deleted")])
    for secret in (made["client_secret"], rotated["client_secret"]):
        assert secret not in every and hashlib.sha256(secret.encode()).hexdigest() not in every


# ---- The client model Authlib's authorization server uses ----


@MODE_FREE
def test_the_client_model_answers_authlib_as_registered():
    confidential = clients.OAuthClient(
        client_id="cl_" + "a" * 32,
        name="Web",
        type="confidential",
        redirect_uris=("https://a.example/cb", "http://127.0.0.1:8000/cb"),
        grant_types=("authorization_code", "client_credentials"),
        scopes=("openid", "email"),
        secret_hash=clients.hash_secret("cs_right"),
    )
    public = clients.OAuthClient("cl_" + "b" * 32, "Phone", "public", ("com.example.app:/cb",))
    assert confidential.get_client_id() == "cl_" + "a" * 32
    assert confidential.get_default_redirect_uri() is None  # two registered: the request must name one
    assert public.get_default_redirect_uri() == "com.example.app:/cb"
    for near_miss in ("https://a.example/cb/", "https://A.example/cb", "https://a.example/cb?x", "https://a.example"):
        assert not confidential.check_redirect_uri(near_miss)
    assert confidential.check_redirect_uri("http://127.0.0.1:8000/cb")
    assert confidential.get_allowed_scope("email openid profile email") == "email openid"
    assert confidential.get_allowed_scope(None) == "" and confidential.get_allowed_scope("profile") == ""
    assert confidential.check_client_secret("cs_right") and not confidential.check_client_secret("cs_wrong")
    assert not public.check_client_secret("") and not public.check_client_secret("anything")
    for endpoint in ("token", "revoke", "introspection"):
        assert confidential.check_endpoint_auth_method("client_secret_basic", endpoint)
        assert confidential.check_endpoint_auth_method("client_secret_post", endpoint)
        assert not confidential.check_endpoint_auth_method("none", endpoint)
        assert public.check_endpoint_auth_method("none", endpoint)
        assert not public.check_endpoint_auth_method("client_secret_basic", endpoint)
    assert confidential.check_response_type("code")
    assert not confidential.check_response_type("token") and not confidential.check_response_type("code id_token")
    assert confidential.check_grant_type("client_credentials") and not confidential.check_grant_type("refresh_token")
    assert public.check_grant_type("refresh_token") and not public.check_grant_type("password")


# ---- The command line ----


def test_the_clients_commands_create_list_rotate_and_delete(cli, app, rdb, entries):
    made = cli(
        "clients", "create", "--name", "Shop", "--type", "confidential",
        "--redirect-uri", "https://shop.example/cb", "--redirect-uri", "http://localhost:3000/cb",
        "--grant-type", "authorization_code", "--grant-type", "client_credentials",
        "--scope", "openid", "--scope", "events", "--post-logout-redirect-uri", "https://shop.example/bye",
        "--first-party", "--audience", "https://api.shop.example",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    id_line, secret_line = made.stdout.splitlines()
    client_id, secret = id_line.removeprefix("client_id "), secret_line.removeprefix("client_secret ")
    assert CLIENT_ID.fullmatch(client_id) and SECRET.fullmatch(secret)
    assert "shown this once" in made.stderr

    listed = cli("clients", "list")
    assert listed.returncode == 0
    (shown,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert shown["client_id"] == client_id and shown["first_party"] is True
    assert shown["grant_types"] == ["authorization_code", "client_credentials"]
    assert shown["scopes"] == ["openid", "events"]
    assert shown["redirect_uris"] == ["https://shop.example/cb", "http://localhost:3000/cb"]
    assert shown["audience"] == "https://api.shop.example" and secret not in listed.stdout

    rotated = cli("clients", "rotate-secret", client_id)
    assert rotated.returncode == 0, rotated.stderr
    new = rotated.stdout.strip().removeprefix("client_secret ")
    with app.app_context():
        found = clients.get_client(client_id)
    assert SECRET.fullmatch(new) and found.check_client_secret(new) and not found.check_client_secret(secret)

    public = cli("clients", "create", "--name", "Phone", "--type", "public", "--redirect-uri", "com.example.app:/cb")
    assert public.returncode == 0 and len(public.stdout.splitlines()) == 1  # no secret
    public_id = public.stdout.strip().removeprefix("client_id ")
    refused = cli("clients", "rotate-secret", public_id)
    assert refused.returncode == 1 and "no secret" in refused.stderr

    assert cli("clients", "delete", client_id).stdout.strip() == f"deleted {client_id}"
    assert list(rdb.hkeys(Keys.oauth_clients())) == [public_id]
    for command in (("delete", client_id), ("rotate-secret", client_id), ("delete", "nonsense")):
        gone = cli("clients", *command)
        assert gone.returncode == 1 and "no OAuth client" in gone.stderr and "Traceback" not in gone.stderr

    for entry_type in ("oauth_client.created", "oauth_client.updated", "oauth_client.deleted"):
        entry = entries(entry_type)[-1]
        assert entry["actor"] == {"kind": "cli", "id": None} and "ip" not in entry


@pytest.mark.parametrize(
    "arguments, what",
    [
        (["--type", "confidential", "--redirect-uri", "http://shop.example/cb"], "loopback"),
        (["--type", "confidential", "--redirect-uri", "com.example.app:/cb"], "public clients"),
        (["--type", "public", "--redirect-uri", "com.example.app:/cb", "--grant-type", "client_credentials"], "client"),
        (["--type", "confidential"], "at least one"),
        (["--type", "confidential", "--redirect-uri", "https://a.example/cb", "--scope", "root"], "root"),
        (["--type", "confidential", "--grant-type", "client_credentials", "--backchannel-logout-uri", "http://127.0.0.1/x"],
         "backchannel"),
    ],
)  # fmt: skip
def test_the_create_command_refuses_a_bad_client_in_one_line(cli, rdb, arguments, what):
    done = cli("clients", "create", "--name", "Bad", *arguments)
    assert done.returncode != 0 and what in done.stderr and "Traceback" not in done.stderr
    assert rdb.hlen(Keys.oauth_clients()) == 0


@MODE_FREE
def test_the_document_describes_the_client_endpoints_as_the_service_answers(app, client, register):
    document = client.get("/openapi.json").get_json()
    made = register(web_app())
    paths = document["paths"]
    for path, methods in {
        "/admin/oauth-clients": {"get", "post"},
        "/admin/oauth-clients/{client_id}": {"get", "patch", "delete"},
        "/admin/oauth-clients/{client_id}/rotate-secret": {"post"},
    }.items():
        assert set(paths[path]) == methods
    (parameter,) = paths["/admin/oauth-clients/{client_id}"]["get"]["parameters"]
    assert re.fullmatch(parameter["schema"]["pattern"].strip("^$"), made["client_id"])
    assert "409" in paths["/admin/oauth-clients/{client_id}/rotate-secret"]["post"]["responses"]
    schemas = document["components"]["schemas"]
    assert re.fullmatch(
        schemas["CreatedClient"]["properties"]["client_secret"]["anyOf"][0]["pattern"], made["client_secret"]
    )
    assert schemas["ClientRequest"]["required"] == ["name", "type", "redirect_uris"]
    assert "client_secret" not in schemas["ClientAnswer"]["properties"]
