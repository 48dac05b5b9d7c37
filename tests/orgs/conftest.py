"""Fixtures for organizations: verified people with bearer headers, organizations made through the API."""

from __future__ import annotations

import pytest

from app.apikeys.store import create_key
from app.auth.users import create_user
from tests.utils import DEFAULT_PASSWORD, bearer, random_email


@pytest.fixture
def person(app, auth):
    """A user made in Redis (verified unless asked otherwise) and logged in: id, email and bearer headers."""

    def make(role: str = "user", verified: bool = True, email: str | None = None) -> dict:
        email = email or random_email()
        with app.app_context():
            user = create_user(email, DEFAULT_PASSWORD, role=role, email_verified=verified)
        tokens = auth.login_body(email)
        return {"id": user["id"], "email": email, "headers": bearer(tokens["access_token"])}

    return make


@pytest.fixture
def org_key(app):
    """Bearer headers of a new API key with the given scopes."""

    def make(*scopes: str) -> dict:
        with app.app_context():
            raw, _ = create_key("orgs test", list(scopes), [])
        return bearer(raw)

    return make


@pytest.fixture
def new_org(client):
    """An organization made through the API by `owner`, with further members at the roles given."""

    def make(owner: dict, *members: tuple[dict, str], name: str = "Acme") -> str:
        created = client.post("/orgs", json={"name": name}, headers=owner["headers"])
        assert created.status_code == 201, created.get_json()
        org_id = created.get_json()["id"]
        for member, role in members:
            add_member(client, org_id, owner, member, role)
        return org_id

    return make


@pytest.fixture
def announced(app, monkeypatch) -> list[tuple]:
    """Every organization change announced on the bus, as (org_id, user_id); still sent."""
    bus = app.extensions["event_bus"]
    seen: list[tuple] = []
    announce = bus.announce_org_changed

    def record(org_id, user_id=None):
        seen.append((org_id, user_id))
        announce(org_id, user_id)

    monkeypatch.setattr(bus, "announce_org_changed", record)
    return seen


def invite(client, org_id: str, by: dict, email: str, role: str = "member"):
    return client.post(f"/orgs/{org_id}/invitations", json={"email": email, "role": role}, headers=by["headers"])


def link_token(app, org_id: str, invitation_id: str) -> str:
    """The token a mail of this invitation would carry (made as building the mail makes it)."""
    from app.orgs import store

    with app.app_context():
        token = store.issue_token(org_id, invitation_id)
    assert token is not None
    return token


def add_member(client, org_id: str, by: dict, member: dict, role: str) -> None:
    """Invite `member` with `role` and accept for them, as the API does it."""
    invited = invite(client, org_id, by, member["email"], role)
    assert invited.status_code == 201, invited.get_json()
    token = link_token(client.application, org_id, invited.get_json()["id"])
    accepted = client.post("/orgs/invitations/accept", json={"token": token}, headers=member["headers"])
    assert accepted.status_code == 200, accepted.get_json()
