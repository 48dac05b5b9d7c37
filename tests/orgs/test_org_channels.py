"""An organization's channels follow its membership on a live gunicorn (two workers): `org_members` and
`org_admins` namespaces, who subscribes and publishes, and revocation within a second on SSE, WebSocket and long
polling when a member is removed, demoted out of `org_admins`, or the organization is deleted; and the OpenID
scope `orgs`. Memberships are made and changed through the organizations API, as clients do.

One server for the module, on the session's Redis in both modes.
"""

from __future__ import annotations

import json
import secrets
import threading
import time

import pytest
import websocket

from app import create_app
from app.auth.users import create_user
from app.orgs import store
from app.redis import Keys
from tests.events.clients import SSE, Api, open_connections, open_ws, ws_json
from tests.events.conftest import FAST
from tests.oidc_provider.flows_support import (
    Browser,
    RelyingParty,
    Service,
    authorized,
    secure_cookies_to_loopback,  # noqa: F401 - a module-scoped autouse fixture
)
from tests.servers import LiveServer, wait_until
from tests.utils import DEFAULT_PASSWORD, random_email

REVOKED_WITHIN = 1.0  # the promise: a member who loses access stops receiving the channel within a second
MARGIN = 2.0  # what a loaded test machine adds to it


@pytest.fixture(scope="module")
def service(base_env, tmp_path_factory):
    """gunicorn with two workers whose OpenID issuer is its own address, and an app in this process on its Redis."""
    web = LiveServer({**base_env, **FAST}, workers=2, log_path=tmp_path_factory.mktemp("orgs") / "gunicorn.log")
    web.env["OIDC_ISSUER"] = web.url
    web.start()
    running = Service(web, create_app({**base_env, **FAST, "OIDC_ISSUER": web.url}))
    running.discovery = running.call("GET", "/.well-known/openid-configuration").json()
    yield running
    web.stop()


class Person(Api):
    """A user with a verified e-mail address (made in Redis), logged in through the server (body transport)."""

    def __init__(self, service: Service, role: str = "user"):
        email = random_email()
        with service.app.app_context():
            create_user(email, DEFAULT_PASSWORD, role=role, email_verified=True)
        super().__init__(service.url, email=email)

    def call(self, method: str, path: str, **kwargs):
        return self.http.request(method, self.base + path, headers=self.auth, timeout=10, **kwargs)


@pytest.fixture
def person(service):
    return lambda role="user": Person(service, role)


@pytest.fixture
def admin(service) -> Person:
    return Person(service, "admin")


def new_org(service: Service, owner: Person, *members: tuple[Person, str]) -> str:
    """An organization made by `owner` through the API, each member invited and accepting with its role."""
    created = owner.call("POST", "/orgs", json={"name": "Acme"})
    assert created.status_code == 201, created.text
    org_id = created.json()["id"]
    for member, role in members:
        invited = owner.call("POST", f"/orgs/{org_id}/invitations", json={"email": member.email, "role": role})
        assert invited.status_code == 201, invited.text
        token = link_token(service, org_id, invited.json()["id"])
        accepted = member.call("POST", "/orgs/invitations/accept", json={"token": token})
        assert accepted.status_code == 200, accepted.text
    return org_id


def link_token(service: Service, org_id: str, invitation_id: str) -> str:
    """A token as the invitation's mail carries it, made once the server's own mail has taken its token (a later
    token replaces an earlier one, so the server's must not come after this one)."""
    invitations = service.app.extensions["redis"]

    def mailed() -> bool:
        held = invitations.hget(Keys.org_invitations(org_id), invitation_id)
        return held is not None and json.loads(held)["token_hash"] != ""

    wait_until(mailed, message="the invitation's mail")
    with service.app.app_context():
        token = store.issue_token(org_id, invitation_id)
    assert token is not None
    return token


def namespace(admin: Person, subscribe: str) -> str:
    name = f"o{secrets.token_hex(4)}"
    rules = {"subscribe": subscribe, "publish": "subscribers"}
    assert admin.call("PUT", f"/admin/namespaces/{name}", json=rules).status_code == 200
    return name


def remove(owner: Person, org_id: str, member: Person) -> None:
    assert owner.call("DELETE", f"/orgs/{org_id}/members/{member.user_id}").status_code == 204


def ws_until(ws, predicate, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        frame = ws_json(ws, max(0.05, deadline - time.monotonic()))
        if predicate(frame):
            return frame


def reader(transport: str, service: Service, user: Api, rooms: list[str]):
    """A live reader of `rooms` and a function that returns its next event or notice (a dict with `kind`)."""
    params = {"channels": ",".join(rooms)}
    if transport == "sse":
        stream = SSE(service.url, user.auth, params=params)
        assert stream.status == 200
        stream.next(skip_comments=False)

        def next_sse(timeout=10.0):
            frame = stream.next_event(timeout)
            return {"kind": frame.get("event"), **frame["data"]}

        return stream.close, next_sse
    ws = open_ws(service.url, user.auth, params=params)
    assert ws_json(ws)["type"] == "welcome"

    def next_ws(timeout=10.0):
        frame = ws_until(ws, lambda f: f["type"] in ("event", "unsubscribed"), timeout)
        return {"kind": frame["event"] if frame["type"] == "event" else "unsubscribed", **frame}

    return ws.close, next_ws


def assert_cut_off(next_item, started: float, room: str, later: str, marker: str) -> None:
    """The reader is told the room is gone (reason `revoked`) within the promise, never gets the event published
    after the change, and goes on reading its other channels."""
    notice = next_item()
    assert (notice["kind"], notice["channel"], notice.get("reason")) == ("unsubscribed", room, "revoked"), notice
    assert time.monotonic() - started < REVOKED_WITHIN + MARGIN
    item = next_item()
    assert item["id"] == marker != later


@pytest.mark.parametrize("transport", ["sse", "websocket"])
def test_a_removed_member_loses_the_organizations_channel_within_a_second(service, admin, person, transport):
    owner, member = person(), person()
    org_id = new_org(service, owner, (member, "member"))
    room = f"{namespace(admin, 'org_members')}:{org_id}.lobby"
    close, next_item = reader(transport, service, member, [room])
    try:
        said = member.publish_ok({"n": 1}, channel=room)  # members publish under `publish: subscribers`
        assert next_item()["id"] == said  # the path delivers
        started = time.monotonic()
        remove(owner, org_id, member)
        later = owner.publish_ok({"n": 2}, channel=room)
        assert member.publish({"n": 3}, channel=room).status_code == 403
        assert_cut_off(next_item, started, room, later, member.publish_ok({"marker": True}))
    finally:
        close()


def test_a_held_long_poll_answers_when_its_member_is_removed(service, admin, person):
    owner, member = person(), person()
    org_id = new_org(service, owner, (member, "member"))
    room = f"{namespace(admin, 'org_members')}:{org_id}"
    cursor = member.poll(channels=room).headers["Event-Cursor"]
    said = owner.publish_ok({"n": 1}, channel=room)
    delivered = member.wait(cursor, channels=room, timeout=10)  # the path delivers
    assert [e["id"] for e in delivered.json()["events"]] == [said]
    cursor = delivered.headers["Event-Cursor"]
    held = {}
    holder = threading.Thread(target=lambda: held.update(answer=member.wait(cursor, channels=room, timeout=20)))
    before = open_connections(service.url, "long_poll")
    holder.start()
    wait_until(lambda: open_connections(service.url, "long_poll") > before, message="a held long poll")
    started = time.monotonic()
    remove(owner, org_id, member)
    holder.join(15)
    assert not holder.is_alive() and time.monotonic() - started < REVOKED_WITHIN + MARGIN
    assert held["answer"].status_code == 204
    refused = member.poll(cursor, channels=room)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"


def test_a_demoted_admin_loses_the_admins_channel_and_keeps_the_members_one(service, admin, person):
    owner, member = person(), person()
    org_id = new_org(service, owner, (member, "admin"))
    staff = f"{namespace(admin, 'org_admins')}:{org_id}.staff"
    everyone = f"{namespace(admin, 'org_members')}:{org_id}"
    close, next_item = reader("websocket", service, member, [staff, everyone])
    try:
        said = owner.publish_ok({"n": 1}, channel=staff)
        assert next_item()["id"] == said
        started = time.monotonic()
        changed = owner.call("PATCH", f"/orgs/{org_id}/members/{member.user_id}", json={"role": "member"})
        assert changed.status_code == 200, changed.text
        later = owner.publish_ok({"n": 2}, channel=staff)
        assert_cut_off(next_item, started, staff, later, owner.publish_ok({"still": "member"}, channel=everyone))
    finally:
        close()


def test_deleting_the_organization_cuts_off_every_member(service, admin, person):
    owner, member = person(), person()
    org_id = new_org(service, owner, (member, "member"))
    room = f"{namespace(admin, 'org_members')}:{org_id}"
    readers = [reader("sse", service, owner, [room]), reader("websocket", service, member, [room])]
    try:
        said = owner.publish_ok({"n": 1}, channel=room)
        for _, next_item in readers:
            assert next_item()["id"] == said
        started = time.monotonic()
        assert owner.call("DELETE", f"/orgs/{org_id}").status_code == 204
        later = admin.publish_ok({"n": 2}, channel=room)  # a service admin still may
        for user, (_, next_item) in zip((owner, member), readers, strict=True):
            assert_cut_off(next_item, started, room, later, user.publish_ok({"marker": True}))
    finally:
        for close, _ in readers:
            close()


def test_who_may_subscribe_follows_the_organization_and_its_roles(service, admin, person):
    owner, member, stranger = person(), person(), person()
    org_id = new_org(service, owner, (member, "member"))
    members_ns, admins_ns = namespace(admin, "org_members"), namespace(admin, "org_admins")
    allowed = [
        (owner, f"{admins_ns}:{org_id}"),
        (member, f"{members_ns}:{org_id}"),
        (member, f"{members_ns}:{org_id}.a.b"),
        (admin, f"{admins_ns}:{org_id}"),  # the service's admins read every channel
    ]
    refused = [
        (member, f"{admins_ns}:{org_id}"),
        (stranger, f"{members_ns}:{org_id}"),
        (member, f"{members_ns}:{org_id}x"),  # another organization's id, not this one's
        (member, f"{members_ns}:x.{org_id}"),
        (member, f"{members_ns}:.{org_id}"),
    ]
    for user, room in allowed:
        assert user.poll(channels=room).status_code == 204, room
    for user, room in refused:
        answer = user.poll(channels=room)
        assert (answer.status_code, answer.json()["error"]["code"]) == (403, "forbidden"), room
        assert user.publish({}, channel=room).status_code == 403
    with pytest.raises(websocket.WebSocketBadStatusException) as rejected:
        open_ws(service.url, stranger.auth, params={"channels": f"{members_ns}:{org_id}"})
    assert rejected.value.status_code == 403
    ws = open_ws(service.url, member.auth)
    try:
        ws_json(ws)
        ws.send(json.dumps({"type": "subscribe", "channel": f"{admins_ns}:{org_id}"}))
        error = ws_until(ws, lambda f: f["type"] == "error")
        assert (error["code"], error["channel"]) == ("forbidden", f"{admins_ns}:{org_id}")
    finally:
        ws.close()


def test_the_orgs_scope_names_the_users_organizations_in_the_id_token_and_userinfo(service, person):
    owner, member = person(), person()
    first = new_org(service, owner, (member, "admin"))
    second = new_org(service, member)
    client, secret = service.new_client(first_party=True)
    browser = Browser(service)
    rp = RelyingParty(service, client, secret, "openid orgs")
    token = authorized(rp, browser, member.email)
    expected = sorted(
        [{"id": first, "name": "Acme", "role": "admin"}, {"id": second, "name": "Acme", "role": "owner"}],
        key=lambda org: org["id"],
    )
    assert rp.verified_id_token(token)["orgs"] == expected
    info = service.call("GET", "/oauth/userinfo", headers={"Authorization": f"Bearer {token['access_token']}"})
    assert info.json() == {"sub": member.user_id, "orgs": expected}

    remove(owner, first, member)  # userinfo says what holds now
    info = service.call("GET", "/oauth/userinfo", headers={"Authorization": f"Bearer {token['access_token']}"})
    assert info.json()["orgs"] == [{"id": second, "name": "Acme", "role": "owner"}]
    plain = authorized(RelyingParty(service, client, secret, "openid"), browser, member.email)
    assert "orgs" not in RelyingParty(service, client, secret, "openid").verified_id_token(plain)
