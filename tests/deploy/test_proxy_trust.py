"""X-Forwarded-* count only from the peers in FORWARDED_ALLOW_IPS: a client reaching gunicorn directly
from another address cannot invent its address (to escape rate limits) or have it recorded."""

from __future__ import annotations

import http.client
import json

import pytest

from tests.servers import LiveServer
from tests.utils import DEFAULT_PASSWORD, random_email

UNTRUSTED_SOURCE = "127.0.0.2"  # on loopback, but not the proxy named in FORWARDED_ALLOW_IPS


@pytest.fixture
def start_server(base_env, tmp_path):
    started = []

    def start(**env):
        started.append(LiveServer({**base_env, **env}, log_path=tmp_path / f"gunicorn-{len(started)}.log"))
        started[-1].start()
        return started[-1]

    yield start
    for live in started:
        live.stop()


def request(server, method: str, path: str, body: dict | None = None, source: str = "127.0.0.1", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10, source_address=(source, 0))
    try:
        payload = json.dumps(body) if body is not None else None
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def login(server, email: str, source: str, forwarded_for: str):
    body = {"email": email, "password": DEFAULT_PASSWORD, "transport": "body"}
    return request(server, "POST", "/auth/login", body, source, {"X-Forwarded-For": forwarded_for})


def test_an_untrusted_peer_cannot_invent_addresses_to_escape_the_login_limit(start_server):
    server = start_server(FORWARDED_ALLOW_IPS="127.0.0.1", RATE_LIMITS_ENABLED="true", RATE_LIMIT_LOGIN="3/minute")
    sprayed = [login(server, random_email(), UNTRUSTED_SOURCE, f"198.51.100.{n}")[0] for n in range(4)]
    assert sprayed == [401, 401, 401, 429]
    # The same invented addresses from the trusted proxy are distinct clients, each with its own limit.
    proxied = [login(server, random_email(), "127.0.0.1", f"203.0.113.{n}")[0] for n in range(4)]
    assert proxied == [401, 401, 401, 401]


def test_the_recorded_session_address_is_the_peer_unless_a_trusted_proxy_names_the_client(start_server):
    server = start_server(FORWARDED_ALLOW_IPS="127.0.0.1/32")
    email = random_email()
    assert request(server, "POST", "/auth/register", {"email": email, "password": DEFAULT_PASSWORD})[0] == 201
    status, direct = login(server, email, UNTRUSTED_SOURCE, "192.0.2.66")
    assert status == 200
    status, proxied = login(server, email, "127.0.0.1", "192.0.2.77")
    assert status == 200
    _, listed = request(server, "GET", "/auth/sessions", headers={"Authorization": f"Bearer {proxied['access_token']}"})
    addresses = {s["id"]: s["ip"] for s in listed["sessions"]}
    assert addresses == {direct["session_id"]: UNTRUSTED_SOURCE, proxied["session_id"]: "192.0.2.77"}
