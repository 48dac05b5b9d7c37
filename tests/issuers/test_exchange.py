"""What an accepted exchange makes: the external user (created once, then found; its e-mail never indexed,
linked or mailed), an ordinary session, the audit entries; channels from a claim (granted until the
token's exp, revoked when no longer listed, section-12 grants untouched); the cookie transport with its
cross-site rule; the rate limit. In process, on both Redis modes."""

from __future__ import annotations

import json
import time

import pytest

from app.auth import oauth, users
from app.channels.namespaces import Namespace, put_namespace
from app.http import rfc3339
from app.issuers import store
from app.mail import messages
from app.redis import Keys
from tests.conftest import https_client
from tests.issuers.issuer import AUDIENCE, Signer, claims, exchange_form
from tests.utils import DEFAULT_PASSWORD, bearer, parse_set_cookies, random_email


def exchange(client, signer: Signer, token_claims: dict, **fields) -> dict:
    answer = client.post("/oauth/token", data=exchange_form(signer.sign(token_claims), **fields))
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()


@pytest.fixture
def hmac_issuer(define):
    """An issuer with an HMAC secret, which lists channels in `rt` and their info in `rt_info`."""
    signer = Signer.hmac()
    name = define(algorithms=["HS256"], secret=signer.private, channels_claim="rt", info_claim="rt_info")
    return name, f"https://{name}.example", signer


# ---- The user ----


def test_the_first_exchange_creates_the_user_and_the_next_finds_it(client, rsa_issuer, rdb, audit_entries):
    name, iss, signer = rsa_issuer
    first = exchange(client, signer, claims(iss, "sub-1", email="Ann@Example.COM"))
    user = first["user"]
    assert user["role"] == "user" and user["email"] == "ann@example.com"
    assert user["external"] == {"issuer": name, "sub": "sub-1"}
    second = exchange(client, signer, claims(iss, "sub-1", email="ann@new.example"))
    assert second["user"]["id"] == user["id"] and second["session_id"] != first["session_id"]
    assert second["user"]["email"] == "ann@new.example"  # as the issuer's latest token gives it
    other = exchange(client, signer, claims(iss, "sub-2"))
    assert other["user"]["id"] != user["id"] and other["user"]["email"] is None
    assert rdb.get(Keys.user_by_external(name, "sub-1")) == user["id"]
    assert rdb.smembers(Keys.issuer_users(name)) == {user["id"], other["user"]["id"]}

    registered = audit_entries("user.registered", subject=user["id"])
    assert [entry["details"] for entry in registered] == [{"method": "token_exchange", "issuer": name, "role": "user"}]
    logins = audit_entries("login.succeeded", subject=user["id"])
    assert [entry["details"]["session_id"] for entry in logins] == [second["session_id"], first["session_id"]]
    for entry in logins:
        assert entry["details"]["method"] == "token_exchange" and entry["details"]["issuer"] == name
        assert entry["actor"] == {"kind": "user", "id": user["id"]} and entry["ip"] == "127.0.0.1"


def test_a_refused_exchange_is_recorded_as_a_failed_login(client, rsa_issuer, audit_entries):
    _, iss, signer = rsa_issuer
    assert client.post("/oauth/token", data=exchange_form(signer.sign(claims(iss, lifetime=-3600)))).status_code == 400
    [entry] = audit_entries("login.failed")
    assert entry["actor"] == {"kind": "system", "id": None} and "subject" not in entry
    assert entry["details"] == {"method": "token_exchange", "reason": "The subject token has expired."}


@pytest.mark.parametrize(
    "claimed",
    ["Bob <bob@example.com>", "bob@example.com, eve@example.com", "=?utf-8?q?bob?=@example.com", "bob", 42, ["a@b.c"]],
)
def test_an_email_claim_that_is_not_one_plain_address_is_stored_as_none(client, rsa_issuer, rdb, claimed):
    _, iss, signer = rsa_issuer
    user = exchange(client, signer, claims(iss, email=claimed))["user"]
    assert user["email"] is None
    assert rdb.hget(Keys.user(user["id"]), "email") == ""


def test_the_email_claim_is_the_one_the_issuer_names(client, define):
    signer = Signer.ec()
    name = define(algorithms=["ES256"], jwks={"keys": [signer.jwk()]}, email_claim="https://app.example/email")
    iss = f"https://{name}.example"
    token = claims(iss, email="wrong@example.com", **{"https://app.example/email": "right@example.com"})
    assert exchange(client, signer, token)["user"]["email"] == "right@example.com"


def test_an_external_users_email_is_never_indexed_linked_merged_nor_reached_by_password_or_oauth(
    app, client, auth, rsa_issuer, rdb
):
    _, iss, signer = rsa_issuer
    local = auth.register()  # a local account with an address an issuer's user also has
    shared = exchange(client, signer, claims(iss, email=local["email"]))["user"]
    assert shared["id"] != local["id"] and shared["email"] == local["email"]
    alone_address = random_email()
    alone = exchange(client, signer, claims(iss, email=alone_address))["user"]
    assert rdb.get(Keys.user_by_email(alone_address)) is None
    assert rdb.get(Keys.user_by_email(local["email"])) == local["id"]

    # Password login: the local account's password reaches the local account; nothing reaches the others.
    assert auth.login_body(local["email"])["user"]["id"] == local["id"]
    for password in (DEFAULT_PASSWORD, "", "x" * 20):
        answer = auth.login(alone_address, password)
        assert answer.status_code == 401 and answer.get_json()["error"]["code"] == "invalid_credentials"
    with app.app_context():
        # A password reset for the address is built for the local account, and for no one else.
        reset = {"kind": messages.PASSWORD_RESET, "id": "j1", "base_url": "https://app.example"}
        assert messages.build({**reset, "email": local["email"]})["To"] == local["email"]
        assert messages.build({**reset, "email": alone_address}) is None
        # An OAuth provider vouching for the address makes (or finds) an account of its own: never the external one.
        found = oauth.find_or_create_user("test", oauth.Identity("oauth-sub", alone_address, True))
        assert found["id"] != alone["id"] and not users.is_external(found)
        linked = oauth.find_or_create_user("test", oauth.Identity("oauth-sub-2", local["email"], True))
        assert linked["id"] == local["id"]
    assert client.post("/auth/password/forgot", json={"email": alone_address}).status_code == 202


def test_an_external_user_changes_no_password(client, rsa_issuer):
    _, iss, signer = rsa_issuer
    tokens = exchange(client, signer, claims(iss))
    change = {"current_password": "", "new_password": "a brand new password"}
    answer = client.post("/auth/password", json=change, headers=bearer(tokens["access_token"]))
    assert answer.status_code == 401


def test_no_verification_link_is_mailed_to_an_address_an_issuer_gave(client, rsa_issuer):
    """The issuer vouches for its users' addresses (or not): this service mails them nothing to verify."""
    _, iss, signer = rsa_issuer
    tokens = exchange(client, signer, claims(iss, email=random_email()))
    answer = client.post("/auth/email/verify/resend", headers=bearer(tokens["access_token"]))
    assert answer.status_code == 409 and answer.get_json()["error"]["code"] == "conflict"


def test_admin_views_and_me_show_the_external_identity(client, admin, rsa_issuer):
    name, iss, signer = rsa_issuer
    tokens = exchange(client, signer, claims(iss, "who", email="who@example.com"))
    user_id = tokens["user"]["id"]
    external = {"issuer": name, "sub": "who"}
    assert client.get("/auth/me", headers=bearer(tokens["access_token"])).get_json()["user"]["external"] == external
    detail = client.get(f"/admin/users/{user_id}", headers=admin["headers"]).get_json()
    assert detail["user"]["external"] == external and detail["user"]["email"] == "who@example.com"
    assert [session["id"] for session in detail["sessions"]] == [tokens["session_id"]]
    listed = client.get("/admin/users", headers=admin["headers"]).get_json()["users"]
    assert next(user for user in listed if user["id"] == user_id)["external"] == external
    # Found by id, never by an address it does not hold in the index.
    assert client.get(
        "/admin/users", query_string={"email": "who@example.com"}, headers=admin["headers"]
    ).get_json() == {"users": []}
    local = client.get("/auth/me", headers=admin["headers"]).get_json()["user"]
    assert "external" not in local


def test_deleting_an_external_user_releases_its_identity(client, admin, rsa_issuer, rdb):
    name, iss, signer = rsa_issuer
    first = exchange(client, signer, claims(iss, "gone"))
    assert client.delete(f"/admin/users/{first['user']['id']}", headers=admin["headers"]).status_code == 204
    assert rdb.get(Keys.user_by_external(name, "gone")) is None
    assert first["user"]["id"] not in rdb.smembers(Keys.issuer_users(name))
    assert client.get("/auth/me", headers=bearer(first["access_token"])).status_code == 401
    again = exchange(client, signer, claims(iss, "gone"))
    assert again["user"]["id"] != first["user"]["id"]


# ---- The session ----


def test_the_answer_is_an_ordinary_session(client, rsa_issuer):
    _, iss, signer = rsa_issuer
    token = claims(iss, "sessions")
    laptop = exchange(client, signer, token, device="laptop")
    phone = exchange(client, signer, token, device="phone")
    tablet = exchange(client, signer, token, device="tablet")
    listed = client.get("/auth/sessions", headers=bearer(laptop["access_token"])).get_json()["sessions"]
    assert sorted(session["device"] for session in listed) == ["laptop", "phone", "tablet"]

    rotated = client.post("/auth/refresh", json={"refresh_token": laptop["refresh_token"]})
    assert rotated.status_code == 200 and rotated.get_json()["user"]["external"] == laptop["user"]["external"]
    reused = client.post("/auth/refresh", json={"refresh_token": laptop["refresh_token"]})
    assert reused.status_code == 401 and reused.get_json()["error"]["code"] == "refresh_token_reused"

    ended = client.delete(f"/auth/sessions/{tablet['session_id']}", headers=bearer(phone["access_token"]))
    assert ended.status_code == 204
    assert client.get("/auth/me", headers=bearer(tablet["access_token"])).status_code == 401
    assert client.post("/auth/logout", headers=bearer(phone["access_token"])).status_code == 204
    assert client.get("/auth/me", headers=bearer(phone["access_token"])).status_code == 401

    again = exchange(client, signer, token, device="again")
    assert client.post("/auth/logout-all", headers=bearer(again["access_token"])).status_code == 204
    for tokens in (again, rotated.get_json()):
        assert client.get("/auth/me", headers=bearer(tokens["access_token"])).status_code == 401


def test_with_transport_cookie_the_session_cookies_are_set_and_the_cross_site_rule_applies(
    app, client, rsa_issuer, rdb
):
    _, iss, signer = rsa_issuer
    form = exchange_form(signer.sign(claims(iss, "cookie-user")), transport="cookie")
    same_site = client.post("/oauth/token", data=form, headers={"Origin": "https://localhost"})
    assert same_site.status_code == 200
    body = same_site.get_json()
    assert "access_token" not in body and "refresh_token" not in body and body["issued_token_type"]
    cookies = parse_set_cookies(same_site.headers.getlist("Set-Cookie"))
    assert cookies["__Host-access"]["httponly"] and cookies["__Host-access"]["samesite"] == "Strict"
    assert cookies["__Secure-refresh"]["path"] == "/auth" and cookies["__Secure-refresh"]["secure"]
    assert client.get("/auth/me").get_json()["session_id"] == body["session_id"]  # by the cookie

    sessions_before = rdb.scard(Keys.user_sessions(body["user"]["id"]))
    for headers in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        cross = client.post("/oauth/token", data=form, headers=headers)
        assert cross.status_code == 403, cross.get_json()
        assert cross.get_json() == {"error": "csrf_rejected", "error_description": "Cross-site request refused."}
        assert cross.headers["Cache-Control"] == "no-store" and "Set-Cookie" not in cross.headers
    assert rdb.scard(Keys.user_sessions(body["user"]["id"])) == sessions_before
    # The body transport is for backends and other origins' scripts: no cookie is set, no rule applies (to a
    # client that sends no session cookie: one that does is held to the rule by every endpoint).
    backend = https_client(app)
    by_body = backend.post(
        "/oauth/token", data={**form, "transport": "body"}, headers={"Origin": "https://evil.example"}
    )
    assert by_body.status_code == 200 and "Set-Cookie" not in by_body.headers


def test_the_exchange_is_rate_limited_per_client_address_as_a_login(make_app, rdb):
    from tests.issuers.conftest import LOOPBACK_KEYS

    limited = https_client(make_app(**LOOPBACK_KEYS, RATE_LIMITS_ENABLED="true", RATE_LIMIT_LOGIN="3/minute"))
    signer = Signer.hmac()
    store.put_issuer(rdb, store.Issuer("limited", "https://l.example", AUDIENCE, ("HS256",), secret=signer.private))
    token = signer.sign(claims("https://l.example"), kid=False)
    answers = [limited.post("/oauth/token", data=exchange_form(token)).status_code for _ in range(3)]
    assert answers == [200, 200, 200]
    refused = limited.post("/oauth/token", data=exchange_form(token))
    assert refused.status_code == 429
    assert refused.get_json()["error"] == "rate_limited" and set(refused.get_json()) == {"error", "error_description"}
    assert int(refused.headers["Retry-After"]) > 0 and refused.headers["Cache-Control"] == "no-store"
    # Another client address has a bucket of its own.
    other = limited.post("/oauth/token", data=exchange_form(token), environ_base={"REMOTE_ADDR": "192.0.2.7"})
    assert other.status_code == 200


# ---- Channels from a claim ----


@pytest.fixture
def rooms(rdb):
    put_namespace(rdb, Namespace("room", subscribe="members", publish="server"))
    put_namespace(rdb, Namespace("open", subscribe="authenticated", publish="subscribers"))


def members(client, admin, channel: str) -> dict:
    answer = client.get(f"/channels/{channel}/members", headers=admin["headers"])
    assert answer.status_code == 200, answer.get_json()
    return {member["user_id"]: member for member in answer.get_json()["members"]}


def test_channels_a_token_lists_are_granted_until_its_exp_with_its_info(client, admin, hmac_issuer, rooms, rdb):
    name, iss, signer = hmac_issuer
    exp = int(time.time()) + 1200
    token = claims(iss, rt=["room:a", "room:b", "open:lobby"], rt_info={"name": "Ann"}, exp=exp)
    tokens = _exchange_hmac(client, signer, token)
    user_id = tokens["user"]["id"]
    for channel in ("room:a", "room:b", "open:lobby"):
        member = members(client, admin, channel)[user_id]
        assert member["info"] == {"name": "Ann"}
        assert member["expires_at"] == rfc3339(exp)
    assert client.get("/channels", headers=bearer(tokens["access_token"])).get_json() == {
        "channels": ["open:lobby", "room:a", "room:b"]
    }


def _exchange_hmac(client, signer: Signer, token_claims: dict, **fields) -> dict:
    answer = client.post("/oauth/token", data=exchange_form(signer.sign(token_claims, kid=False), **fields))
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()


def test_the_next_exchange_revokes_what_it_no_longer_lists_and_announces_it(
    app, client, admin, hmac_issuer, rooms, monkeypatch, audit_entries
):
    name, iss, signer = hmac_issuer
    announced = []
    bus = app.extensions["event_bus"]
    announce = bus.announce_access_changed
    monkeypatch.setattr(
        bus,
        "announce_access_changed",
        lambda reason, **where: (announced.append((reason, where)), announce(reason, **where)),
    )
    first = _exchange_hmac(client, signer, claims(iss, "rev", rt=["room:a", "room:b"]))
    user_id = first["user"]["id"]
    assert {(reason, where["channel"]) for reason, where in announced} == {
        ("access_changed", "room:a"),
        ("access_changed", "room:b"),
    }
    announced.clear()
    _exchange_hmac(client, signer, claims(iss, "rev", rt=["room:b", "room:c"]))
    assert user_id not in members(client, admin, "room:a")
    assert set(members(client, admin, "room:b")) == set(members(client, admin, "room:c")) == {user_id}
    assert ("revoked", {"channel": "room:a", "user_id": user_id}) in announced
    announced.clear()
    _exchange_hmac(client, signer, claims(iss, "rev"))  # the claim is gone: so are its channels
    assert not members(client, admin, "room:b") and not members(client, admin, "room:c")
    assert sorted(where["channel"] for reason, where in announced if reason == "revoked") == ["room:b", "room:c"]

    added = [entry["details"]["channel"] for entry in audit_entries("channel.member_added", subject=user_id)]
    removed = [entry["details"]["channel"] for entry in audit_entries("channel.member_removed", subject=user_id)]
    assert sorted(added) == ["room:a", "room:b", "room:c"]  # a renewal of room:b is not recorded again
    assert sorted(removed) == ["room:a", "room:b", "room:c"]
    for entry in audit_entries("channel.member_added", subject=user_id):
        assert entry["actor"] == {"kind": "system", "id": None} and entry["details"]["source"] == f"issuer:{name}"


def test_grants_made_through_the_api_are_never_touched_by_a_claim(client, admin, hmac_issuer, rooms):
    name, iss, signer = hmac_issuer
    user_id = _exchange_hmac(client, signer, claims(iss, "kept"))["user"]["id"]
    path = f"/channels/room:api/members/{user_id}"
    assert (
        client.put(path, json={"info": {"by": "api"}, "expires_in": 3600}, headers=admin["headers"]).status_code == 204
    )
    before = members(client, admin, "room:api")[user_id]
    # A token listing it does not replace it (info and expiry stay the API's)...
    _exchange_hmac(client, signer, claims(iss, "kept", rt=["room:api", "room:claim"], rt_info={"by": "claim"}))
    assert members(client, admin, "room:api")[user_id] == before
    assert members(client, admin, "room:claim")[user_id]["info"] == {"by": "claim"}
    # ...and one that stops listing it does not revoke it.
    _exchange_hmac(client, signer, claims(iss, "kept"))
    assert members(client, admin, "room:api")[user_id] == before
    assert user_id not in members(client, admin, "room:claim")
    # A grant through the API over a claim's makes it the API's: no later claim revokes it.
    _exchange_hmac(client, signer, claims(iss, "kept", rt=["room:claim"]))
    assert client.put(f"/channels/room:claim/members/{user_id}", json={}, headers=admin["headers"]).status_code == 204
    _exchange_hmac(client, signer, claims(iss, "kept"))
    assert members(client, admin, "room:claim")[user_id]["expires_at"] is None


def test_malformed_names_and_names_of_no_namespace_are_ignored(client, admin, hmac_issuer, rooms, rdb):
    name, iss, signer = hmac_issuer
    listed = [
        "room:ok",
        "nothere:x",
        "user:abc",
        "broadcast",
        "room:",
        "room:a b",
        "ROOM:x",
        5,
        None,
        {"c": 1},
        "room:ok",
    ]
    tokens = _exchange_hmac(client, signer, claims(iss, "odd", rt=listed))
    assert client.get("/channels", headers=bearer(tokens["access_token"])).get_json() == {"channels": ["room:ok"]}
    assert sorted(rdb.hkeys(Keys.user_grants(tokens["user"]["id"]))) == ["room:ok"]
    # A claim that is no list grants nothing (and takes back what the last one granted).
    for not_a_list in ("room:ok", {"room:ok": True}, 7):
        tokens = _exchange_hmac(client, signer, claims(iss, "odd", rt=not_a_list))
        assert client.get("/channels", headers=bearer(tokens["access_token"])).get_json() == {"channels": []}


def test_info_is_the_info_claims_object_of_at_most_one_kib(client, admin, hmac_issuer, rooms):
    name, iss, signer = hmac_issuer
    for info, shown in (
        ({"name": "Ann", "colour": "é"}, {"name": "Ann", "colour": "é"}),
        ({"big": "x" * 1100}, None),  # over 1 KiB: granted without info
        ("a string", None),
        ([1, 2], None),
    ):
        user_id = _exchange_hmac(client, signer, claims(iss, "info", rt=["room:info"], rt_info=info))["user"]["id"]
        assert members(client, admin, "room:info")[user_id]["info"] == shown


def test_an_issuer_without_a_channels_claim_grants_nothing(client, admin, rsa_issuer, rooms):
    name, iss, signer = rsa_issuer
    tokens = exchange(client, signer, claims(iss, rt=["room:a"], channels=["room:a"]))
    assert client.get("/channels", headers=bearer(tokens["access_token"])).get_json() == {"channels": []}


def test_an_external_user_adds_no_passkey_nor_totp_so_has_no_way_in_but_its_issuer(client, auth, rsa_issuer):
    """A token exchange proves no factor of this service: what needs a fresh proof is refused, and no proof can
    be given (no password, no passkey). Else a passkey would outlive the issuer's trust."""
    _, iss, signer = rsa_issuer
    local = auth.new_user_tokens()  # a password login proves a factor: the same requests go through
    external = exchange(client, signer, claims(iss))
    for path in ("/auth/passkeys/register/options", "/auth/mfa/totp/setup"):
        assert client.post(path, headers=bearer(local["access_token"])).status_code == 200
        refused = client.post(path, headers=bearer(external["access_token"]))
        assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "reauthentication_required"
    for password in ("", DEFAULT_PASSWORD):
        again = client.post(
            "/auth/reauthenticate", json={"password": password}, headers=bearer(external["access_token"])
        )
        assert again.status_code == 401


def test_a_renewed_claim_grant_keeps_its_start_and_a_new_one_starts_anew(app, client, hmac_issuer, rooms, rdb):
    """A member reads from its grant's start: renewing by the next exchange keeps it, as a PUT in force does."""
    name, iss, signer = hmac_issuer
    user_id = _exchange_hmac(client, signer, claims(iss, "start", rt=["room:s"]))["user"]["id"]

    def start() -> str:
        return json.loads(rdb.hget(Keys.channel_members("room:s"), user_id))["start"]

    first = start()
    with app.app_context():
        app.extensions["event_bus"].publish("room:s", "said", {"n": 1})
    _exchange_hmac(client, signer, claims(iss, "start", rt=["room:s"]))
    assert start() == first
    _exchange_hmac(client, signer, claims(iss, "start"))  # revoked
    _exchange_hmac(client, signer, claims(iss, "start", rt=["room:s"]))  # granted anew: from the present on
    assert start() != first
