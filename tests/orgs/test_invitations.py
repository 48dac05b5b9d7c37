"""Invitations: who may invite, the mailed link (to a real SMTP server), and accepting it: once, by the invited
verified address only, within 7 days, not after a revocation; an existing member keeps the higher role.
In process, on the session's Redis in both modes."""

from __future__ import annotations

import time
import uuid

import pytest

from app.auth.users import create_user
from app.orgs import store
from app.redis import Keys
from tests.account.conftest import MAIL_FROM, PUBLIC_BASE_URL
from tests.conftest import https_client
from tests.mailserver import SmtpServer
from tests.orgs.conftest import add_member, invite, link_token
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer, random_email, redis_snapshot

ACCEPT = "/orgs/invitations/accept"


def accept(client, token: str, who: dict):
    return client.post(ACCEPT, json={"token": token}, headers=who["headers"])


def error_code(response) -> str:
    return response.get_json()["error"]["code"]


@pytest.fixture(scope="module")
def catcher():
    """A mail catcher on loopback (plain SMTP, as SMTP_STARTTLS=never allows for one)."""
    server = SmtpServer(None, mode="plain", auth=False).start()
    yield server
    server.stop()


def test_the_invitation_link_is_mailed_and_accepted_once(make_app, catcher, rdb):
    """The invitee gets one mail with `{PUBLIC_BASE_URL}/invitation?token=...`; the token is used once, and
    only its hash is kept."""
    app = make_app(SMTP_URL=catcher.url(), SMTP_STARTTLS="never", MAIL_FROM=MAIL_FROM, PUBLIC_BASE_URL=PUBLIC_BASE_URL)
    client = https_client(app)
    auth = AuthActions(client)
    people = {}
    for name in ("owner", "invitee"):
        email = random_email()
        with app.app_context():
            user = create_user(email, DEFAULT_PASSWORD, email_verified=True)
        people[name] = {"id": user["id"], "email": email, "headers": bearer(auth.login_body(email)["access_token"])}
    owner, invitee = people["owner"], people["invitee"]
    org_id = client.post("/orgs", json={"name": "Acme & Co"}, headers=owner["headers"]).get_json()["id"]
    queued_before = set(rdb.zrange(Keys.mail_queue(), 0, -1))
    invited = invite(client, org_id, owner, invitee["email"].upper(), "admin")
    assert invited.status_code == 201
    invitation = invited.get_json()
    assert invitation["email"] == invitee["email"] and invitation["role"] == "admin"
    assert set(invitation) == {"id", "email", "role", "created_at", "expires_at"}
    [job_id] = set(rdb.zrange(Keys.mail_queue(), 0, -1)) - queued_before
    app.extensions["mail_queue"].process(job_id)
    [mail] = catcher.wait_for(invitee["email"])
    assert mail.recipients == [invitee["email"]] and "Acme &amp; Co" in mail.html and "Acme & Co" in mail.text
    link = mail.link()
    assert link.startswith(f"{PUBLIC_BASE_URL}/invitation?token=")
    token = link.partition("?token=")[2]
    org_part, invitation_id, secret = token.split(".")
    assert (org_part, invitation_id) == (org_id, invitation["id"]) and len(secret) >= 43  # >= 256 bits
    stored = rdb.hget(Keys.org_invitations(org_id), invitation_id)
    assert secret not in stored and store._hash(secret) in stored

    accepted = accept(client, token, invitee)
    assert accepted.status_code == 200
    assert accepted.get_json() == {**accepted.get_json(), "id": org_id, "name": "Acme & Co", "role": "admin"}
    again = accept(client, token, invitee)
    assert again.status_code == 400 and error_code(again) == "invalid_token"
    assert client.get(f"/orgs/{org_id}/invitations", headers=owner["headers"]).get_json()["invitations"] == []


def test_who_may_invite_and_see_invitations(client, rdb, person, new_org):
    owner, admin, member, outsider = person(), person(), person(), person()
    org = new_org(owner, (admin, "admin"), (member, "member"))
    before = redis_snapshot(rdb)
    assert invite(client, org, member, random_email()).status_code == 403
    assert invite(client, org, admin, random_email(), "owner").status_code == 403
    assert invite(client, org, outsider, random_email()).status_code == 404  # outsiders see no organization
    for bad in ("not an address", "a@b@c", "x\n@example.com"):
        assert invite(client, org, owner, bad).status_code == 422, bad
    assert invite(client, org, owner, random_email(), "boss").status_code == 422
    assert redis_snapshot(rdb) == before
    assert invite(client, org, admin, random_email(), "admin").status_code == 201
    assert invite(client, org, owner, random_email(), "owner").status_code == 201
    assert invite(client, org, owner, member["email"]).status_code == 201  # a member may be invited again
    listed = client.get(f"/orgs/{org}/invitations", headers=admin["headers"])
    assert sorted(v["role"] for v in listed.get_json()["invitations"]) == ["admin", "member", "owner"]
    assert client.get(f"/orgs/{org}/invitations", headers=member["headers"]).status_code == 403


def test_used_revoked_expired_unknown_and_malformed_tokens_are_invalid(client, person, new_org, monkeypatch):
    owner, invitee = person(), person()
    org = new_org(owner)
    tokens = []
    for _ in range(2):
        invitation = invite(client, org, owner, invitee["email"]).get_json()
        tokens.append((invitation["id"], link_token(client.application, org, invitation["id"])))
    (revoked_id, revoked), (_, expiring) = tokens
    assert client.delete(f"/orgs/{org}/invitations/{revoked_id}", headers=invitee["headers"]).status_code == 404
    assert client.delete(f"/orgs/{org}/invitations/{revoked_id}", headers=owner["headers"]).status_code == 204
    assert client.delete(f"/orgs/{org}/invitations/{revoked_id}", headers=owner["headers"]).status_code == 404
    unknown = f"{org}.{uuid.uuid4().hex}.{'A' * 43}"
    wrong_secret = expiring[:-4] + ("AAAA" if not expiring.endswith("AAAA") else "BBBB")
    for token in (revoked, unknown, wrong_secret, "abc", f"{org}..x", expiring + ".x"):
        refused = accept(client, token, invitee)
        assert refused.status_code == 400 and error_code(refused) == "invalid_token", token

    class Later:
        @staticmethod
        def time():
            return time.time() + store.INVITATION_LIFETIME + 1

    monkeypatch.setattr(store, "time", Later)
    expired = accept(client, expiring, invitee)
    assert expired.status_code == 400 and error_code(expired) == "invalid_token"
    monkeypatch.undo()
    assert accept(client, expiring, invitee).status_code == 400  # an expired invitation is gone for good
    assert client.get(f"/orgs/{org}", headers=invitee["headers"]).status_code == 404


def test_only_the_invited_verified_address_accepts(client, person, new_org, app, rdb):
    owner, other = person(), person()
    email = random_email()
    unverified = person(verified=False, email=email)
    org = new_org(owner)
    invitation = invite(client, org, owner, email).get_json()
    token = link_token(app, org, invitation["id"])
    before = redis_snapshot(rdb)
    refused = accept(client, token, other)
    assert refused.status_code == 403 and error_code(refused) == "forbidden"
    refused = accept(client, token, unverified)
    assert refused.status_code == 403 and error_code(refused) == "email_not_verified"
    assert redis_snapshot(rdb) == before  # the token is still good
    with app.app_context():
        rdb.hset(Keys.user(unverified["id"]), "email_verified", "1")
    assert accept(client, token, unverified).status_code == 200


def test_an_existing_member_keeps_the_higher_role(client, person, new_org, announced):
    owner, admin, member = person(), person(), person()
    org = new_org(owner, (admin, "admin"), (member, "member"))
    announced.clear()
    add_member(client, org, owner, admin, "member")  # kept: admin
    add_member(client, org, owner, member, "admin")  # upgraded
    members = client.get(f"/orgs/{org}/members", headers=owner["headers"]).get_json()["members"]
    roles = {m["user_id"]: m["role"] for m in members}
    assert roles == {owner["id"]: "owner", admin["id"]: "admin", member["id"]: "admin"}
    assert announced == [(org, member["id"])]


def test_a_revoked_invitation_is_not_mailed(client, rdb, person, new_org, caplog):
    """The token is made when the mail is built: an invitation revoked before that gets no mail and no token."""
    owner = person()
    org = new_org(owner)
    invitation = invite(client, org, owner, random_email()).get_json()
    [job_id] = [j for j in rdb.zrange(Keys.mail_queue(), 0, -1) if rdb.hget(Keys.mail_job(j), "org_id") == org]
    assert client.delete(f"/orgs/{org}/invitations/{invitation['id']}", headers=owner["headers"]).status_code == 204
    with caplog.at_level("INFO", logger="app.mail"):
        client.application.extensions["mail_queue"].process(job_id)
    assert "nothing to send" in caplog.text and "/invitation?token=" not in caplog.text
    assert not rdb.exists(Keys.mail_job(job_id))
