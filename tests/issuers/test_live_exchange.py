"""The token exchange against a live gunicorn (two gevent workers), keys fetched over HTTP from the test's
loopback JWKS server: the external user reads its events (poll and SSE) and the channels its token lists;
the next exchange that no longer lists a channel takes it from a live SSE connection within a second (the
rest goes on, section-12 grants untouched); deleting the issuer ends its sessions and their live
connections within a second."""

from __future__ import annotations

import secrets
import time

import pytest
import requests

from app.auth.users import create_user
from tests.events.clients import SSE, Api, open_ws, ws_close_code, ws_json
from tests.events.conftest import FAST
from tests.issuers.conftest import LOOPBACK_KEYS
from tests.issuers.issuer import AUDIENCE, Signer, claims, exchange_form
from tests.servers import LiveServer
from tests.utils import DEFAULT_PASSWORD, random_email

WITHIN = 1.0  # the promise: revocation and the end of a session reach live connections within a second
MARGIN = 2.0  # what a busy test machine adds to it


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    env = {**base_env, **FAST, **LOOPBACK_KEYS}
    live = LiveServer(env, workers=2, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


class Admin(Api):
    """An administrator of the live server: issuers, namespaces, grants, publishing."""

    def call(self, method: str, path: str, expected: int, **kwargs) -> requests.Response:
        answer = self.http.request(method, f"{self.base}{path}", headers=self.auth, timeout=10, **kwargs)
        assert answer.status_code == expected, answer.text
        return answer


@pytest.fixture
def admin(server, app) -> Admin:
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
    return Admin(server.url, email=email)


@pytest.fixture
def issuer(admin, key_server):
    """An issuer of EC keys at the JWKS server, whose tokens list channels in `rt`: (name, iss, signer)."""
    signer = Signer.ec()
    name = f"live-{secrets.token_hex(4)}"
    url = key_server.publish(f"/{name}.json", signer)
    body = {"issuer": f"https://{name}.example", "audience": AUDIENCE, "algorithms": ["ES256"], "jwks_url": url}
    admin.call("PUT", f"/admin/issuers/{name}", 200, json={**body, "channels_claim": "rt"})
    return name, f"https://{name}.example", signer


@pytest.fixture
def room(admin) -> str:
    """A namespace whose channels only granted users read."""
    name = f"m{secrets.token_hex(4)}"
    admin.call("PUT", f"/admin/namespaces/{name}", 200, json={"subscribe": "members", "publish": "server"})
    return name


class External(Api):
    """A user of the issuer's, logged in here by exchanging the issuer's tokens (body transport)."""

    def __init__(self, base: str, signer: Signer, iss: str, sub: str | None = None):  # noqa: D107 - no Api login
        self.base, self.http, self.signer, self.iss = base, requests.Session(), signer, iss
        self.sub = sub or f"ext-{secrets.token_hex(4)}"
        self.exchange()

    def exchange(self, **token_claims) -> dict:
        token = self.signer.sign(claims(self.iss, self.sub, **token_claims))
        answer = self.http.post(f"{self.base}/oauth/token", data=exchange_form(token), timeout=10)
        assert answer.status_code == 200, answer.text
        tokens = answer.json()
        self.access_token, self.refresh_token = tokens["access_token"], tokens["refresh_token"]
        self.session_id, self.user_id = tokens["session_id"], tokens["user"]["id"]
        return tokens


def next_item(stream: SSE, timeout: float = 10.0) -> dict:
    """The stream's next event or notice: its name and data."""
    frame = stream.next_event(timeout)
    return {"kind": frame.get("event"), **frame["data"]}


def test_an_external_user_reads_its_events_by_polling_and_sse(server, issuer):
    _, iss, signer = issuer
    user = External(server.url, signer, iss)
    assert user.poll().status_code == 204
    stream = SSE(server.url, user.auth)
    try:
        stream.next(skip_comments=False)  # the stream is open
        sent = user.publish_ok({"hello": "world"})
        assert next_item(stream)["id"] == sent
        assert user.poll(user.current_cursor()).status_code == 204
    finally:
        stream.close()


def test_the_next_exchange_takes_a_channel_it_no_longer_lists_from_a_live_stream_within_a_second(
    server, admin, issuer, room
):
    _, iss, signer = issuer
    user = External(server.url, signer, iss)
    claimed, granted = f"{room}:claimed", f"{room}:granted"
    user.exchange(rt=[claimed])
    admin.call("PUT", f"/channels/{granted}/members/{user.user_id}", 204, json={})  # a section-12 grant
    stream = SSE(server.url, user.auth, params={"channels": f"{claimed},{granted}"})
    try:
        assert stream.status == 200, stream.body
        stream.next(skip_comments=False)
        before = admin.publish_ok({"n": 1}, channel=claimed, event="update")
        assert next_item(stream)["id"] == before  # the claimed channel's events arrive

        started = time.monotonic()
        user.exchange(rt=[])  # the backend no longer grants it
        after = admin.publish_ok({"n": 2}, channel=claimed, event="update")
        notice = next_item(stream)
        assert (notice["kind"], notice["channel"], notice["reason"]) == ("unsubscribed", claimed, "revoked")
        assert time.monotonic() - started < WITHIN + MARGIN

        kept = admin.publish_ok({"n": 3}, channel=granted, event="update")  # the API's grant stays
        item = next_item(stream)
        assert item["id"] == kept != after  # the later event of the revoked channel never came
        members = admin.call("GET", f"/channels/{granted}/members", 200).json()["members"]
        assert [member["user_id"] for member in members] == [user.user_id]
    finally:
        stream.close()


def test_deleting_the_issuer_ends_its_sessions_and_their_live_connections_within_a_second(
    server, admin, issuer, key_server
):
    name, iss, signer = issuer
    first = External(server.url, signer, iss)
    second = External(server.url, signer, iss)
    outsider = Api(server.url)  # a local user: untouched
    stream = SSE(server.url, first.auth)
    ws = open_ws(server.url, second.auth)
    try:
        stream.next(skip_comments=False)
        assert ws_json(ws)["type"] == "welcome"
        sent = first.publish_ok({"before": True})
        assert next_item(stream)["id"] == sent  # the stream delivers

        started = time.monotonic()
        admin.call("DELETE", f"/admin/issuers/{name}", 204)
        assert next_item(stream)["kind"] == "session_ended"
        assert stream.closed.wait(WITHIN + MARGIN)
        assert ws_close_code(ws, WITHIN + MARGIN) == 1008
        assert time.monotonic() - started < WITHIN + MARGIN
    finally:
        stream.close()
        ws.close()
    for user in (first, second):
        assert user.poll().status_code == 401
        refreshed = user.http.post(f"{server.url}/auth/refresh", json={"refresh_token": user.refresh_token})
        assert refreshed.status_code == 401
        token = signer.sign(claims(iss, user.sub))
        again = user.http.post(f"{server.url}/oauth/token", data=exchange_form(token))
        assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    assert outsider.poll().status_code == 204
    entry = admin.call("GET", "/admin/audit", 200, params={"type": "issuer.deleted"}).json()["entries"][0]
    assert entry["details"] == {"issuer": name, "users_logged_out": 2}
