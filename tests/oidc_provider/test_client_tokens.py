"""What a client does with its tokens, against a live gunicorn: refresh (rotation and reuse detection as every
session's), client credentials, public clients, client authentication, revocation, the events endpoints with
scope `events` (and every other endpoint refusing a client's token), and each way a client session ends making
its tokens stop working.

One service per module; each test has its own users and clients.
"""

from __future__ import annotations

import pytest
import requests
from authlib.integrations.base_client import OAuthError

from app.auth import mailtokens
from app.oidc import clients
from tests.events.clients import SSE
from tests.oidc_provider.flows_support import (
    Browser,
    RelyingParty,
    authorized,
    secure_cookies_to_loopback,  # noqa: F401 - a module-scoped autouse fixture
    start_service,
)
from tests.servers import wait_until
from tests.utils import DEFAULT_PASSWORD, bearer

REQUEST_CHECKS = pytest.mark.not_on_cluster("checks of the request alone: the same code whatever the Redis")


@pytest.fixture(scope="module")
def service(base_env, tmp_path_factory):
    running = start_service(base_env, tmp_path_factory.mktemp("oidc-tokens"))
    yield running
    running.web.stop()


def signed_in(service, scope: str = "openid offline_access", **client_fields):
    """A first-party client, a user signed in on a browser, and the client's tokens for them."""
    client, secret = service.new_client(first_party=True, **client_fields)
    user = service.new_user()
    browser = Browser(service)
    rp = RelyingParty(service, client, secret, scope)
    token = authorized(rp, browser, user["email"])
    return rp, browser, user, token


def refresh(rp: RelyingParty, refresh_token: str, **kwargs) -> dict:
    return rp.session.refresh_token(rp.service.discovery["token_endpoint"], refresh_token=refresh_token, **kwargs)


def token_error(call) -> str:
    with pytest.raises(OAuthError) as refused:
        call()
    return refused.value.error


def works(service, token: dict) -> bool:
    """Whether the access token is still good at userinfo."""
    return service.call("GET", "/oauth/userinfo", headers=bearer(token["access_token"])).status_code == 200


def test_refresh_tokens_rotate_and_a_reused_one_ends_the_session(service):
    rp, browser, user, token = signed_in(service)
    sid = rp.verified_id_token(token)["sid"]
    second = refresh(rp, token["refresh_token"])
    assert second["refresh_token"] != token["refresh_token"] and second["access_token"] != token["access_token"]
    assert "id_token" not in second and second["expires_in"] == 900
    assert service.introspect(second["access_token"])["sid"] == sid  # the same session
    narrowed = refresh(rp, second["refresh_token"], scope="openid")
    assert narrowed["scope"] == "openid"
    assert token_error(lambda: refresh(rp, narrowed["refresh_token"], scope="openid email")) == "invalid_scope"

    # The rotated-away token again: reuse. The whole family ends with the session, the newest token included.
    assert token_error(lambda: refresh(rp, second["refresh_token"])) == "invalid_grant"
    assert token_error(lambda: refresh(rp, narrowed["refresh_token"])) == "invalid_grant"
    assert not works(service, narrowed) and service.introspect(narrowed["access_token"]) == {"active": False}
    assert sid not in [session["id"] for session in browser.go("/auth/sessions").json()["sessions"]]
    entries = browser.go("/auth/activity?limit=100").json()["entries"]
    reuse = [entry["details"]["session_id"] for entry in entries if entry["type"] == "refresh.reuse_detected"]
    assert reuse == [sid]


def test_a_refresh_token_works_for_its_own_client_only(service):
    rp, browser, user, token = signed_in(service)
    other, other_secret = service.new_client(first_party=True)
    thief = RelyingParty(service, other, other_secret, "openid offline_access")
    assert token_error(lambda: refresh(thief, token["refresh_token"])) == "invalid_grant"
    assert refresh(rp, token["refresh_token"])["access_token"]  # not rotated (or burnt) by the other's attempt
    # Nor at the service's own refresh, which would give the service's tokens for it.
    own = service.call("POST", "/auth/refresh", json={"refresh_token": token["refresh_token"]})
    assert own.status_code == 401 and own.json()["error"]["code"] == "invalid_refresh_token"
    # And a browser session's refresh token is no client's.
    body = {"email": user["email"], "password": DEFAULT_PASSWORD, "transport": "body"}
    login = service.call("POST", "/auth/login", json=body)
    assert token_error(lambda: refresh(rp, login.json()["refresh_token"])) == "invalid_grant"


def test_client_credentials_give_the_client_its_own_token(service):
    client, secret = service.new_client(
        grant_types=("client_credentials",), redirect_uris=(), scopes=("openid", "events", "orgs")
    )
    backend = RelyingParty(service, client, secret, "events")
    token = backend.session.fetch_token(service.discovery["token_endpoint"], grant_type="client_credentials")
    assert "refresh_token" not in token and "id_token" not in token and token["scope"] == "events"
    introspected = service.introspect(token["access_token"])
    assert introspected["active"] is True and introspected["sub"] == client.client_id
    assert introspected["client_id"] == client.client_id and "sid" not in introspected
    # No user: userinfo and the events endpoints refuse it.
    assert not works(service, token)
    assert service.call("GET", "/events", headers=bearer(token["access_token"])).status_code == 401
    fetch = backend.session.fetch_token
    endpoint = service.discovery["token_endpoint"]
    assert token_error(lambda: fetch(endpoint, grant_type="client_credentials", scope="openid")) == "invalid_scope"
    with_code, code_secret = service.new_client()  # registered without the grant
    other = RelyingParty(service, with_code, code_secret, "openid")
    assert token_error(lambda: other.session.fetch_token(endpoint, grant_type="client_credentials")) == (
        "unauthorized_client"
    )
    # Deleting the client refuses its tokens at once.
    with service.app.app_context():
        assert clients.delete_client(client.client_id)
    assert service.introspect(token["access_token"]) == {"active": False}


@REQUEST_CHECKS
def test_a_public_client_authenticates_by_its_id_alone(service):
    client, secret = service.new_client(type="public", redirect_uris=("com.example.app:/oauth/cb",), first_party=True)
    assert secret is None
    user = service.new_user()
    rp = RelyingParty(service, client, None, "openid offline_access")
    browser = Browser(service)
    answer = rp.authorize(browser)
    assert browser.sign_in(user["email"]).status_code == 200
    answer = type(answer)(browser.go(answer.sign_in_next))
    assert answer.response.headers["Location"].startswith("com.example.app:/oauth/cb?code=")
    token = rp.session.fetch_token(
        service.discovery["token_endpoint"],
        code=answer.response.headers["Location"].split("code=")[1].split("&")[0],
        code_verifier=rp.verifier,
    )
    assert rp.verified_id_token(token)["sub"] == user["id"] and refresh(rp, token["refresh_token"])["access_token"]


@REQUEST_CHECKS
def test_confidential_clients_must_authenticate(service):
    client, secret = service.new_client(first_party=True)
    endpoint = service.discovery["token_endpoint"]
    form = {"grant_type": "authorization_code", "code": "x", "code_verifier": "v" * 43}
    attempts = {
        "a wrong secret by Basic": {"auth": (client.client_id, "cs_wrong")},
        "a wrong secret in the form": {"data": {**form, "client_id": client.client_id, "client_secret": "cs_wrong"}},
        "no secret at all": {"data": {**form, "client_id": client.client_id}},
        "an unknown client": {"auth": ("cl_" + "0" * 32, secret)},
        "an unknown client in the form": {"data": {**form, "client_id": "cl_" + "0" * 32, "client_secret": secret}},
        "nothing": {},
    }
    for case, sent in attempts.items():
        answer = requests.post(endpoint, data=sent.pop("data", form), timeout=10, **sent)
        assert answer.status_code == 401, (case, answer.text)
        assert answer.json()["error"] == "invalid_client" and answer.headers["Cache-Control"] == "no-store", case
        assert answer.headers["WWW-Authenticate"].startswith("Basic"), case
    # The right secret by either way gets past client authentication (to the code, which is no code).
    for sent in (
        {"auth": (client.client_id, secret)},
        {"data": {**form, "client_id": client.client_id, "client_secret": secret}},
    ):
        answer = requests.post(endpoint, data=sent.pop("data", form), timeout=10, **sent)
        assert answer.status_code == 400 and answer.json()["error"] == "invalid_grant"


def test_revocation_of_access_and_refresh_tokens(service):
    rp, browser, user, token = signed_in(service)
    endpoint = service.discovery["revocation_endpoint"]
    sid = rp.verified_id_token(token)["sid"]
    other = refresh(rp, token["refresh_token"])

    assert rp.session.revoke_token(endpoint, other["access_token"], "access_token").status_code == 200
    assert not works(service, other) and service.introspect(other["access_token"]) == {"active": False}
    assert sid in [session["id"] for session in browser.go("/auth/sessions").json()["sessions"]]  # the session lives
    fresh = refresh(rp, other["refresh_token"])
    assert works(service, fresh)

    stranger, stranger_secret = service.new_client(first_party=True)
    someone_else = RelyingParty(service, stranger, stranger_secret, "openid")
    refused = someone_else.session.revoke_token(endpoint, fresh["refresh_token"])
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant" and works(service, fresh)
    assert rp.session.revoke_token(endpoint, "no-such-token").status_code == 200  # nothing to do: 200 (RFC 7009)
    unauthenticated = requests.post(endpoint, data={"token": fresh["refresh_token"]}, timeout=10)
    assert unauthenticated.status_code == 401 and works(service, fresh)

    assert rp.session.revoke_token(endpoint, fresh["refresh_token"], "refresh_token").status_code == 200
    assert not works(service, fresh)  # the session ended: every token of it
    assert token_error(lambda: refresh(rp, fresh["refresh_token"])) == "invalid_grant"
    assert sid not in [session["id"] for session in browser.go("/auth/sessions").json()["sessions"]]


def test_scope_events_reads_the_users_events_and_nothing_else_takes_a_clients_token(service):
    rp, browser, user, token = signed_in(service, "openid events", name="Chat app")
    access = bearer(token["access_token"])
    channel = f"user:{user['id']}"

    polled = service.call("GET", "/events", headers=access)
    assert polled.status_code == 204, polled.text
    published = service.call("POST", "/events", json={"channel": channel, "event": "hello", "data": 1}, headers=access)
    assert published.status_code == 201, published.text
    elsewhere = {"channel": "broadcast", "event": "hello", "data": 1}
    assert service.call("POST", "/events", json=elsewhere, headers=access).status_code == 403
    stream = SSE(service.url, access, cursor=polled.headers["Event-Cursor"])
    try:
        assert stream.status == 200
        assert stream.next_event()["data"]["event"] == "hello"
        # Its session ends (the user ends it on the page): the stream ends within a second, as any session's.
        sid = rp.verified_id_token(token)["sid"]
        ended = browser.go(f"/auth/sessions/{sid}", method="DELETE", headers={"Origin": service.url})
        assert ended.status_code == 204
        assert stream.next_event(timeout=3)["event"] == "session_ended"
    finally:
        stream.close()
    assert service.call("GET", "/events", headers=access).status_code == 401

    # Without scope events, the events endpoints refuse it; every other endpoint refuses any client's token.
    _, _, _, plain = signed_in(service, "openid")
    assert service.call("GET", "/events", headers=bearer(plain["access_token"])).status_code == 401
    admin = service.new_user(role="admin")
    client, secret = service.new_client(first_party=True)
    admins_token = authorized(RelyingParty(service, client, secret, "openid events"), Browser(service), admin["email"])
    for path in ("/auth/me", "/auth/sessions", "/auth/consents", "/admin/users?q=a", "/channels"):
        answer = service.call("GET", path, headers=bearer(admins_token["access_token"]))
        assert answer.status_code == 401, (path, answer.text)
    # ... and at the events endpoints an administrator's application is no administrator.
    assert (
        service.call("POST", "/events", json=elsewhere, headers=bearer(admins_token["access_token"])).status_code == 403
    )


def end_by_browser_logout(service, browser, user, sid):
    assert browser.go("/auth/logout", method="POST", headers={"Origin": service.url}).status_code == 204


def end_by_logout_all(service, browser, user, sid):
    assert browser.go("/auth/logout-all", method="POST", headers={"Origin": service.url}).status_code == 204


def end_by_password_reset(service, browser, user, sid):
    with service.app.app_context():
        token = mailtokens.issue_token(user["id"], user["email"], mailtokens.RESET)
    body = {"token": token, "new_password": "another good passphrase"}
    assert service.call("POST", "/auth/password/reset", json=body).status_code == 204


def end_by_an_administrator(service, browser, user, sid):
    admin = service.new_user(role="admin")
    body = {"email": admin["email"], "password": DEFAULT_PASSWORD, "transport": "body"}
    login = service.call("POST", "/auth/login", json=body)
    ended = service.call("DELETE", f"/admin/users/{user['id']}/sessions", headers=bearer(login.json()["access_token"]))
    assert ended.status_code == 204


def end_on_the_page(service, browser, user, sid):
    assert browser.go(f"/auth/sessions/{sid}", method="DELETE", headers={"Origin": service.url}).status_code == 204


def end_by_deleting_the_client(service, browser, user, sid, client_id=None):
    with service.app.app_context():
        assert clients.delete_client(client_id)


@pytest.mark.parametrize(
    "end",
    [
        end_by_browser_logout,
        end_by_logout_all,
        end_by_password_reset,
        end_by_an_administrator,
        end_on_the_page,
        end_by_deleting_the_client,
    ],
)
def test_every_way_a_client_session_ends_stops_its_tokens(service, end):
    rp, browser, user, token = signed_in(service, "openid events offline_access")
    sid = rp.verified_id_token(token)["sid"]
    other_browser = Browser(service)  # another device of the user's, which only the ways that end all sessions end
    assert other_browser.sign_in(user["email"]).status_code == 200
    assert works(service, token)
    if end is end_by_deleting_the_client:
        end(service, browser, user, sid, client_id=rp.client.client_id)
    else:
        end(service, browser, user, sid)
    wait_until(lambda: not works(service, token), timeout=5, message="the token refused")
    assert service.introspect(token["access_token"]) == {"active": False}
    assert service.call("GET", "/events", headers=bearer(token["access_token"])).status_code == 401
    error = token_error(lambda: refresh(rp, token["refresh_token"]))
    assert error == ("invalid_client" if end is end_by_deleting_the_client else "invalid_grant")
    if end is end_by_browser_logout:  # the browser's other sessions (another device) go on
        assert other_browser.go("/auth/me").status_code == 200
