"""The active organization of a session: `POST /auth/org` in both transports and its refusals, the `org_id` and
`org_role` claims of the session's access tokens (read when each token is issued), and introspection.

Memberships are made and changed through the organizations API. In process, on the session's Redis in both modes.
"""

from __future__ import annotations

import uuid

import jwt
import pytest

from app.apikeys.store import create_key
from app.auth.users import create_user
from tests.orgs.conftest import add_member
from tests.utils import DEFAULT_PASSWORD, bearer, parse_set_cookies, random_email, redis_snapshot

ORIGIN = "https://localhost"


def set_role(client, org_id: str, owner: dict, member: dict, role: str) -> None:
    changed = client.patch(f"/orgs/{org_id}/members/{member['id']}", json={"role": role}, headers=owner["headers"])
    assert changed.status_code == 200, changed.get_json()


def remove_member(client, org_id: str, owner: dict, member: dict) -> None:
    assert client.delete(f"/orgs/{org_id}/members/{member['id']}", headers=owner["headers"]).status_code == 204


def delete_org(client, org_id: str, owner: dict) -> None:
    assert client.delete(f"/orgs/{org_id}", headers=owner["headers"]).status_code == 204


def claims_of(access_token: str) -> dict:
    return jwt.decode(access_token, options={"verify_signature": False})


def org_claims(access_token: str) -> tuple:
    claims = claims_of(access_token)
    return claims.get("org_id"), claims.get("org_role")


@pytest.fixture
def person(app, auth):
    """A user with a verified address (made in Redis) logged in with the body transport: its tokens, id, e-mail
    and bearer headers."""

    def make() -> dict:
        email = random_email()
        with app.app_context():
            create_user(email, DEFAULT_PASSWORD, email_verified=True)
        tokens = auth.login_body(email)
        return {**tokens, "id": tokens["user"]["id"], "email": email, "headers": bearer(tokens["access_token"])}

    return make


@pytest.fixture
def introspect(app, client):
    with app.app_context():
        key, _ = create_key("introspection", ["tokens:introspect"], [])

    def ask(token: str) -> dict:
        answer = client.post("/auth/introspect", data={"token": token}, headers=bearer(key))
        assert answer.status_code == 200
        return answer.get_json()

    return ask


def switch(client, headers: dict, org_id):
    return client.post("/auth/org", json={"org_id": org_id}, headers=headers)


def refresh(client, refresh_token: str):
    return client.post("/auth/refresh", json={"refresh_token": refresh_token})


def test_a_member_switches_by_bearer_and_gets_tokens_in_the_body_that_name_the_organization(
    client, person, new_org, introspect
):
    ann = person()
    org_id = new_org(ann)
    assert org_claims(ann["access_token"]) == (None, None)  # a login names no organization

    answer = switch(client, ann["headers"], org_id)
    assert answer.status_code == 200, answer.get_json()
    assert answer.headers["Cache-Control"] == "no-store" and "Set-Cookie" not in answer.headers
    body = answer.get_json()
    assert set(body) == {
        "access_token",
        "token_type",
        "expires_in",
        "refresh_token",
        "refresh_expires_in",
        "session_id",
        "user",
    }
    assert body["session_id"] == ann["session_id"] and body["user"]["id"] == ann["id"]
    assert org_claims(body["access_token"]) == (org_id, "owner")
    assert claims_of(body["access_token"])["sid"] == ann["session_id"]
    status = client.get("/auth/status", headers=bearer(body["access_token"])).get_json()  # a page after a reload
    assert status["org_id"] == org_id

    introspected = introspect(body["access_token"])
    assert introspected["active"] is True
    assert (introspected["org_id"], introspected["org_role"]) == (org_id, "owner")
    assert "org_id" not in introspect(ann["access_token"])  # the older token named none

    # The refresh token rotated as a refresh rotates it: the old one is reuse now, the new one refreshes, and the
    # refreshed token still names the organization.
    again = refresh(client, body["refresh_token"])
    assert again.status_code == 200
    assert org_claims(again.get_json()["access_token"]) == (org_id, "owner")
    reused = refresh(client, ann["refresh_token"])
    assert reused.status_code == 401 and reused.get_json()["error"]["code"] == "refresh_token_reused"


def test_null_clears_the_organization(client, person, new_org):
    ann = person()
    org_id = new_org(ann)
    first = switch(client, ann["headers"], org_id).get_json()
    cleared = switch(client, bearer(first["access_token"]), None)
    assert cleared.status_code == 200
    assert org_claims(cleared.get_json()["access_token"]) == (None, None)
    assert client.get("/auth/status", headers=bearer(cleared.get_json()["access_token"])).get_json()["org_id"] is None
    assert org_claims(refresh(client, cleared.get_json()["refresh_token"]).get_json()["access_token"]) == (None, None)


def test_a_cookie_session_switches_by_cookie_and_gets_new_cookies(client, auth, person, new_org):
    user = person()
    org_id = new_org(user)
    assert auth.login(user["email"], transport="cookie").status_code == 200
    answer = client.post("/auth/org", json={"org_id": org_id}, headers={"Origin": ORIGIN})
    assert answer.status_code == 200, answer.get_json()
    assert "access_token" not in answer.get_json() and "refresh_token" not in answer.get_json()
    cookies = parse_set_cookies(answer.headers.getlist("Set-Cookie"))
    assert org_claims(cookies["__Host-access"]["value"]) == (org_id, "owner")
    assert cookies["__Secure-refresh"]["path"] == "/auth" and cookies["__Host-access"]["httponly"] is True
    refreshed = client.post("/auth/refresh", headers={"Origin": ORIGIN})  # with the new refresh cookie
    assert refreshed.status_code == 200
    access = parse_set_cookies(refreshed.headers.getlist("Set-Cookie"))["__Host-access"]["value"]
    assert org_claims(access) == (org_id, "owner")

    foreign = client.post("/auth/org", json={"org_id": None}, headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 403 and foreign.get_json()["error"]["code"] == "csrf_rejected"


def test_refusals_change_nothing(client, app, rdb, person, new_org):
    ann, bob = person(), person()
    org_id = new_org(ann)
    other = new_org(bob)
    with app.app_context():
        key, _ = create_key("a key", ["tokens:introspect"], [])
    before = redis_snapshot(rdb, ("ratelimit", "apikey:"))  # (a key notes when it was last used)
    refused = [
        (switch(client, ann["headers"], other), 403),  # not a member
        (switch(client, ann["headers"], uuid.uuid4().hex), 403),  # no such organization
        (switch(client, ann["headers"], "../" + org_id), 403),  # not an id: not looked up
        (switch(client, {}, org_id), 401),
        (switch(client, bearer("garbage"), org_id), 401),
        (client.post("/auth/org", json={}, headers=ann["headers"]), 400),
        (client.post("/auth/org", json={"org_id": 7}, headers=ann["headers"]), None),
        (client.post("/auth/org", data="org_id", headers=ann["headers"]), None),
    ]
    refused.append((switch(client, bearer(key), org_id), 403))  # an API key is no session
    for answer, status in refused:
        assert answer.status_code == status if status else 400 <= answer.status_code < 500, answer.get_json()
        assert set(answer.get_json()) == {"error"}
    assert redis_snapshot(rdb, ("ratelimit", "apikey:")) == before
    assert refresh(client, ann["refresh_token"]).status_code == 200  # the refresh token was not rotated


def test_the_next_token_follows_a_role_change_a_removal_and_a_deletion(client, person, new_org, introspect):
    ann, bob = person(), person()
    org_id = new_org(ann, (bob, "admin"))
    tokens = switch(client, bob["headers"], org_id).get_json()
    assert org_claims(tokens["access_token"]) == (org_id, "admin")

    set_role(client, org_id, ann, bob, "member")
    assert (introspect(tokens["access_token"])["org_role"]) == "member"  # introspection says the role held now
    tokens = refresh(client, tokens["refresh_token"]).get_json()
    assert org_claims(tokens["access_token"]) == (org_id, "member")

    remove_member(client, org_id, ann, bob)
    assert client.get("/auth/status", headers=bearer(tokens["access_token"])).get_json()["org_id"] is None  # at once
    gone = introspect(tokens["access_token"])
    assert gone["active"] is True and "org_id" not in gone and "org_role" not in gone
    tokens = refresh(client, tokens["refresh_token"]).get_json()
    assert org_claims(tokens["access_token"]) == (None, None)
    add_member(client, org_id, ann, bob, "member")  # back in: the session had forgotten the organization
    assert org_claims(refresh(client, tokens["refresh_token"]).get_json()["access_token"]) == (None, None)

    owner = switch(client, ann["headers"], org_id).get_json()
    assert org_claims(owner["access_token"]) == (org_id, "owner")
    delete_org(client, org_id, ann)
    assert org_claims(refresh(client, owner["refresh_token"]).get_json()["access_token"]) == (None, None)
    assert switch(client, bearer(owner["access_token"]), org_id).status_code == 403


def test_a_new_login_starts_without_an_organization(client, auth, person, new_org):
    ann = person()
    org_id = new_org(ann)
    assert switch(client, ann["headers"], org_id).status_code == 200
    another = auth.login_body(ann["email"])
    assert org_claims(another["access_token"]) == (None, None)
    assert org_claims(refresh(client, another["refresh_token"]).get_json()["access_token"]) == (None, None)


def test_an_ended_session_cannot_switch(client, person, new_org):
    ann = person()
    org_id = new_org(ann)
    assert client.post("/auth/logout", headers=ann["headers"]).status_code == 204
    assert switch(client, ann["headers"], org_id).status_code == 401


def test_a_token_with_malformed_organization_claims_is_refused(client, person):
    from tests.conftest import TEST_JWT_SECRET

    ann = person()
    claims = claims_of(ann["access_token"])
    for extra in ({"org_id": "x"}, {"org_id": 1, "org_role": "owner"}, {"org_role": "owner"}):
        forged = jwt.encode({**claims, **extra}, TEST_JWT_SECRET, algorithm="HS256", headers={"typ": "at+jwt"})
        assert client.get("/auth/me", headers=bearer(forged)).status_code == 401
