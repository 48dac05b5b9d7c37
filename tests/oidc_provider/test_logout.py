"""Back-channel logout against real processes: gunicorn, the delivery process (`worker.py`) and a relying party's
receiver on loopback. Client sessions are made by the real flow (the browser's authorization, the code redeemed by
Authlib's client). Every way a client session ends tells its client within 5 s, with a logout token a relying
party verifies against the JWKS; a failing receiver gets it again; an address refused at sending gets nothing.

One service per module (each test has its own users, clients and receiver path).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import pytest
import requests

from app import create_app
from app.auth import mailtokens
from app.auth.users import create_user
from app.outgoing.backchannel import target_id
from app.redis import Keys
from tests.oidc_provider.logout_support import authorize, logout_token_of, verified_logout_claims
from tests.outgoing.receivers import DeliveryProcess, Receiver
from tests.servers import LiveServer, flush_redis, wait_until
from tests.utils import DEFAULT_PASSWORD, bearer, random_email

# The delivery's retries and address checks are the webhooks' own code, whatever the Redis.
SENDING_ONLY = pytest.mark.not_on_cluster("retries and address checks of the delivery, the same on any Redis")
DEADLINE = 5.0  # the contract's: a client hears of a session's end within 5 s
OUT = {
    "WEBHOOK_OUT_ALLOW_PRIVATE": "true",  # the relying party's receiver is on loopback, over plain HTTP
    "WEBHOOK_OUT_ALLOW_HTTP": "true",
    "WEBHOOK_OUT_RETRY_SCHEDULE": "1,2",
    "WEBHOOK_OUT_TIMEOUT_SECONDS": "2",
    "WEBHOOK_OUT_CONNECT_TIMEOUT_SECONDS": "1",
}


@dataclass
class Provider:
    """The running service, an in-process app on its Redis, and the relying parties' receiver."""

    web: LiveServer
    worker: DeliveryProcess
    receiver: Receiver
    app: object
    env: dict
    admin: dict
    logs: object

    @property
    def url(self) -> str:
        return self.web.url

    def call(self, method: str, path: str, **kwargs) -> requests.Response:
        return requests.request(method, self.url + path, timeout=10, allow_redirects=False, **kwargs)

    def new_client(self, **fields) -> tuple[dict, str]:
        """A registered first-party client (no consent page) whose back-channel URI is a path of its own on the
        receiver: (C with its `client_secret`, that path)."""
        path = f"/backchannel/{uuid.uuid4().hex[:12]}"
        body = {
            "name": f"Shop {path[-4:]}",
            "type": "confidential",
            "redirect_uris": ["https://shop.example/cb"],
            "post_logout_redirect_uris": ["https://shop.example/bye"],
            "scopes": ["openid", "email", "offline_access"],
            "backchannel_logout_uri": self.receiver.url(path),
            "first_party": True,
            **fields,
        }
        answer = self.call("POST", "/admin/oauth-clients", json=body, headers=self.admin)
        assert answer.status_code == 201, answer.text
        return answer.json(), path

    def new_user(self) -> dict:
        """A user signed in twice: on a device (body transport: `token`, `session_id`) and on a browser (cookie
        transport: `cookie`, `browser_session_id`), from which clients are authorized."""
        email = random_email()
        with self.app.app_context():
            user = create_user(email, DEFAULT_PASSWORD)
        found = {"id": user["id"], "email": email}
        for transport in ("body", "cookie"):
            body = {"email": email, "password": DEFAULT_PASSWORD, "transport": transport}
            login = self.call("POST", "/auth/login", json=body)
            assert login.status_code == 200, login.text
            if transport == "body":
                found.update(token=login.json()["access_token"], session_id=login.json()["session_id"])
            else:
                found.update(cookie=login.cookies["__Host-access"], browser_session_id=login.json()["session_id"])
        return found

    def authorized(self, user: dict, client: dict) -> dict:
        """The user's browser authorizes the client: its tokens, the ID token's claims in `claims`."""
        return authorize(self.url, client, client["client_secret"], user["cookie"])

    def logout_claims(self, path: str, client_id: str, count: int = 1) -> list[dict]:
        """The verified claims of the first `count` logout tokens the receiver got at `path`."""
        arrived = self.receiver.wait_for(path, count, timeout=DEADLINE + 10)
        jwks = self.call("GET", "/.well-known/jwks.json").json()
        issuer_url = self.call("GET", "/.well-known/openid-configuration").json()["issuer"]
        for request in arrived:
            assert request.headers["Content-Type"] == "application/x-www-form-urlencoded"
            assert not any(name.lower().startswith("webhook-") for name in request.headers)  # the token is the proof
        return [verified_logout_claims(logout_token_of(r.body), jwks, issuer_url, client_id) for r in arrived[:count]]


@pytest.fixture(scope="module")
def provider(base_env, redis_server, tmp_path_factory):
    flush_redis(redis_server)  # keys an earlier module sealed under another SECRET_KEY would not sign here
    logs = tmp_path_factory.mktemp("logout")
    (logs / "metrics").mkdir()
    env = {**base_env, **OUT, "PROMETHEUS_MULTIPROC_DIR": str(logs / "metrics")}
    # One gunicorn worker: a session's end is told by the delivery process, whichever web worker ended it.
    web = LiveServer(env, workers=1, log_path=logs / "gunicorn.log")
    env["OIDC_ISSUER"] = web.env["OIDC_ISSUER"] = web.url  # the discovery document names its own endpoints
    web.start()
    worker = DeliveryProcess(env, logs / "worker.log").start()
    receiver = Receiver().start()
    app = create_app(env)
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
    login = requests.post(
        web.url + "/auth/login", json={"email": email, "password": DEFAULT_PASSWORD, "transport": "body"}, timeout=10
    )
    running = Provider(web, worker, receiver, app, env, bearer(login.json()["access_token"]), logs)
    yield running
    running.worker.kill()  # quicker than its orderly stop, which tests/outgoing/test_ssrf.py tests
    web.stop()
    receiver.stop()


def arrived_in_time(provider: Provider, path: str, ended_at: float) -> None:
    first = provider.receiver.wait_for(path, 1, timeout=DEADLINE + 10)[0]
    assert first.at - ended_at <= DEADLINE, f"the logout came {first.at - ended_at:.1f} s after the session ended"


# ---- Every way a client session ends ----


def end_by_deleting_it(provider, user, client, token):
    session_id = token["claims"]["sid"]
    assert provider.call("DELETE", f"/auth/sessions/{session_id}", headers=bearer(user["token"])).status_code == 204


def end_by_logging_out_the_browser(provider, user, client, token):
    cookie = {"Cookie": f"__Host-access={user['cookie']}"}
    assert provider.call("POST", "/auth/logout", headers=cookie).status_code == 204


def end_by_reusing_a_refresh_token(provider, user, client, token):
    auth = (client["client_id"], client["client_secret"])
    form = {"grant_type": "refresh_token", "refresh_token": token["refresh_token"]}
    assert provider.call("POST", "/oauth/token", data=form, auth=auth).status_code == 200
    reused = provider.call("POST", "/oauth/token", data=form, auth=auth)
    assert reused.status_code == 400 and reused.json()["error"] == "invalid_grant"


def end_by_logout_everywhere(provider, user, client, token):
    assert provider.call("POST", "/auth/logout-all", headers=bearer(user["token"])).status_code == 204


def end_by_password_change(provider, user, client, token):
    body = {"current_password": DEFAULT_PASSWORD, "new_password": "another good passphrase"}
    assert provider.call("POST", "/auth/password", json=body, headers=bearer(user["token"])).status_code == 204


def end_by_password_reset(provider, user, client, token):
    with provider.app.app_context():
        token = mailtokens.issue_token(user["id"], user["email"], mailtokens.RESET)
    body = {"token": token, "new_password": "another good passphrase"}
    assert provider.call("POST", "/auth/password/reset", json=body).status_code == 204


def end_by_an_administrator(provider, user, client, token):
    assert provider.call("DELETE", f"/admin/users/{user['id']}/sessions", headers=provider.admin).status_code == 204


def end_by_deleting_the_user(provider, user, client, token):
    assert provider.call("DELETE", f"/admin/users/{user['id']}", headers=provider.admin).status_code == 204


def end_by_deleting_the_client(provider, user, client, token):
    answer = provider.call("DELETE", f"/admin/oauth-clients/{client['client_id']}", headers=provider.admin)
    assert answer.status_code == 204


def end_by_rp_initiated_logout(provider, user, client, token):
    query = {"id_token_hint": token["id_token"], "post_logout_redirect_uri": "https://shop.example/bye", "state": "s1"}
    answer = provider.call("GET", "/oauth/logout", params=query)
    assert answer.status_code == 302 and answer.headers["Location"] == "https://shop.example/bye?state=s1"


WAYS = [
    end_by_deleting_it,
    end_by_logging_out_the_browser,
    end_by_reusing_a_refresh_token,
    end_by_logout_everywhere,
    end_by_password_change,
    end_by_password_reset,
    end_by_an_administrator,
    end_by_deleting_the_user,
    end_by_deleting_the_client,
    end_by_rp_initiated_logout,
]


@dataclass
class Ended:
    """A client session ended one way: what its test checks."""

    client: dict
    path: str
    user: dict
    session_id: str
    listed: list[dict]  # the user's sessions just before the end
    ended_at: float


def end_a_client_session(provider: Provider, end) -> Ended:
    """A new client and user, the user's session of the client, and its end by `end`."""
    client, path = provider.new_client()
    user = provider.new_user()
    token = provider.authorized(user, client)
    listed = provider.call("GET", "/auth/sessions", headers=bearer(user["token"])).json()["sessions"]
    end(provider, user, client, token)
    return Ended(client, path, user, token["claims"]["sid"], listed, time.time())


@pytest.fixture(scope="module")
def ended(provider) -> dict:
    """Every way's client session, made and ended one after the other when the first of their tests starts, each
    with a client and a user of its own: by a test's turn, most of the half second it watches for a late
    duplicate has passed. An error in a way's ending is raised in that way's own test."""
    done = {}
    for end in WAYS:
        try:
            done[end.__name__] = (end_a_client_session(provider, end), None)
        except Exception as error:  # noqa: BLE001 - raised again in the way's own test
            done[end.__name__] = (None, error)
    return done


@pytest.mark.parametrize("end", WAYS, ids=[way.__name__ for way in WAYS])
def test_a_client_hears_of_its_session_ending_within_five_seconds(provider, ended, end):
    session, error = ended[end.__name__]
    if error is not None:
        raise error
    client, path, user, session_id = session.client, session.path, session.user, session.session_id
    assert {"id": session_id, "device": client["name"]}.items() <= next(
        s for s in session.listed if s["id"] == session_id
    ).items()

    arrived_in_time(provider, path, session.ended_at)
    (claims,) = provider.logout_claims(path, client["client_id"])
    assert claims["sub"] == user["id"] and claims["sid"] == session_id
    with provider.app.app_context():
        assert not provider.app.extensions["redis"].exists(Keys.session(user["id"], session_id))
        assert not provider.app.extensions["redis"].hexists(Keys.client_sessions(user["id"]), session_id)
    # Nothing more comes for that one session: a late duplicate would arrive within half a second of the first.
    arrived_at = provider.receiver.at(path)[0].at
    time.sleep(max(0.0, arrived_at + 0.5 - time.time()))
    assert len(provider.receiver.at(path)) == 1


def test_deleting_a_client_tells_it_of_every_users_session_and_ends_them(provider):
    client, path = provider.new_client()
    other, other_path = provider.new_client()
    users = [provider.new_user() for _ in range(2)]
    held = {
        provider.authorized(user, client)["claims"]["sid"]: user["id"]
        for user in users
        for _ in range(2 if user is users[0] else 1)
    }
    kept_token = provider.authorized(users[0], other)
    kept = kept_token["claims"]["sid"]

    end_by_deleting_the_client(provider, users[0], client, None)
    ended_at = time.time()

    arrived_in_time(provider, path, ended_at)
    claims = provider.logout_claims(path, client["client_id"], count=3)
    assert {(c["sid"], c["sub"]) for c in claims} == set(held.items())
    redis_client = provider.app.extensions["redis"]
    for session_id, user_id in held.items():
        assert not redis_client.exists(Keys.session(user_id, session_id))
    # The other client's session lives on and is not told of anything, until it ends too.
    assert redis_client.exists(Keys.session(users[0]["id"], kept)) and provider.receiver.at(other_path) == []
    end_by_deleting_it(provider, users[0], other, kept_token)
    assert [c["sid"] for c in provider.logout_claims(other_path, other["client_id"])] == [kept]


def test_a_client_without_a_backchannel_uri_is_sent_nothing_and_its_session_leaves_the_index(provider):
    client, _ = provider.new_client(backchannel_logout_uri=None)
    user = provider.new_user()
    token = provider.authorized(user, client)
    session_id = token["claims"]["sid"]
    end_by_deleting_it(provider, user, client, token)
    redis_client = provider.app.extensions["redis"]
    assert not redis_client.hexists(Keys.client_sessions(user["id"]), session_id)
    assert not redis_client.sismember(Keys.backchannel_targets(), target_id(client["client_id"]))


@SENDING_ONLY
def test_a_receiver_that_fails_gets_the_logout_again_with_a_fresh_token(provider):
    client, path = provider.new_client()
    provider.receiver.behave(path, fail_first=1, fail_status=503)
    user = provider.new_user()
    token = provider.authorized(user, client)
    session_id = token["claims"]["sid"]

    end_by_deleting_it(provider, user, client, token)

    first, second = provider.logout_claims(path, client["client_id"], count=2)
    assert first["sid"] == second["sid"] == session_id
    assert first["jti"] != second["jti"]  # each attempt signs anew: a retry is no replay to the client
    arrivals = provider.receiver.at(path)
    assert arrivals[1].at - arrivals[0].at >= 0.9  # WEBHOOK_OUT_RETRY_SCHEDULE's first delay, 1 s here
    target = target_id(client["client_id"])
    redis_client = provider.app.extensions["redis"]

    def delivered():
        ids = redis_client.zrange(Keys.outgoing_messages(target), 0, -1)
        return len(ids) == 1 and redis_client.hget(Keys.outgoing_message(target, ids[0]), "status") == "delivered"

    wait_until(delivered, message="the message delivered")
    # And not sent a third time: no retry scheduled, no delivery in flight, two attempts recorded. (A wait
    # here could not see a third send: WEBHOOK_OUT_RETRY_SCHEDULE's next delay, 2 s, is past any short one.)
    (message_id,) = redis_client.zrange(Keys.outgoing_messages(target), 0, -1)
    assert redis_client.zscore(Keys.outgoing_retries(target), message_id) is None
    assert redis_client.xpending(Keys.outgoing_queue(target), "deliver")["pending"] == 0
    assert redis_client.llen(Keys.outgoing_attempts(target, message_id)) == 2
    assert len(provider.receiver.at(path)) == 2


@SENDING_ONLY
def test_an_address_refused_at_sending_gets_nothing_until_the_settings_allow_it(provider):
    """The URI was allowed when saved (WEBHOOK_OUT_ALLOW_PRIVATE=true); a delivery process without that setting
    refuses the loopback address at connection time, and records why. The same message then reaches the receiver
    once a process allowed to send it takes over: the path works, only the refusal kept it away."""
    client, path = provider.new_client()
    user = provider.new_user()
    token = provider.authorized(user, client)
    session_id = token["claims"]["sid"]
    provider.worker.kill()
    strict_env = {**provider.env, "WEBHOOK_OUT_ALLOW_PRIVATE": "false", "WEBHOOK_OUT_RETRY_SCHEDULE": "3"}
    strict = DeliveryProcess(strict_env, provider.logs / "strict-worker.log").start()
    try:
        end_by_deleting_it(provider, user, client, token)
        target = target_id(client["client_id"])
        redis_client = provider.app.extensions["redis"]

        def refused_attempt():
            ids = redis_client.zrange(Keys.outgoing_messages(target), 0, -1)
            attempts = redis_client.lrange(Keys.outgoing_attempts(target, ids[0]), 0, -1) if ids else []
            return attempts[0] if attempts else None

        attempt = wait_until(refused_attempt, timeout=DEADLINE + 10, message="the refused attempt")
        assert '"status_code":null' in attempt and "forbidden address" in attempt
        assert provider.receiver.at(path) == []
    finally:
        strict.kill()
        provider.worker = DeliveryProcess(provider.env, provider.logs / "worker-2.log").start()
    (claims,) = provider.logout_claims(path, client["client_id"])
    assert claims["sid"] == session_id
