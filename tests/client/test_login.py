"""The Python client's own sessions against the live service: login (and its second factor), renewal before the
access token expires (one rotation however many threads ask, the old refresh token never presented again),
logout, a session from a token exchange renewed alike, and a reader that keeps receiving across a renewal."""

from __future__ import annotations

import secrets
import threading
import time

import httpx
import pyotp
import pytest
from auth_rt_client import (
    ApiError,
    Client,
    EventReader,
    LoginRequired,
    MfaRequired,
    ProtocolError,
    ServiceUnreachable,
    Tokens,
    session,
)

from app.redis import Keys
from tests.client.collector import Collector
from tests.client.conftest import create_key
from tests.client.lossy_proxy import LossyProxy
from tests.events.conftest import FAST
from tests.issuers.issuer import AUDIENCE, Signer, claims
from tests.servers import LiveServer, wait_until
from tests.utils import DEFAULT_PASSWORD, bearer, random_email

pytestmark = pytest.mark.not_on_cluster("the client speaks HTTP; sessions on both modes are tested in tests/auth")

# Access tokens this short make the service end them, and the client renew them, within a test: the client
# renews once less than half a lifetime (here 2 s) is left.
ACCESS_TOKEN_TTL = 4
RENEWAL_DUE = ACCESS_TOKEN_TTL / 2


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    """One worker whose access tokens live four seconds."""
    env = {**base_env, **FAST, "ACCESS_TOKEN_TTL_SECONDS": str(ACCESS_TOKEN_TTL)}
    live = LiveServer(env, log_path=tmp_path_factory.mktemp("logs") / "app.log")
    live.start()
    yield live
    live.stop()


def register(server: LiveServer) -> str:
    """A new account's e-mail address (its password is DEFAULT_PASSWORD)."""
    email = random_email()
    made = httpx.post(f"{server.url}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD})
    assert made.status_code == 201, made.text
    return email


def family_size(redis_server, tokens: Tokens) -> int:
    """How many refresh tokens the session's family has had: 1 + the number of rotations."""
    return redis_server.client().scard(Keys.session_tokens(tokens.user.id, tokens.session_id))


def me_status(server: LiveServer, access_token: str) -> int:
    return httpx.get(f"{server.url}/auth/me", headers=bearer(access_token)).status_code


def in_threads(count: int, call) -> list:
    """What `call()` answers in each of `count` threads released at the same moment; fails on any error."""
    start = threading.Barrier(count)
    answers: list = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            start.wait(10)
            answers.append(call())
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert len(answers) == count
    return answers


def test_login_then_authenticated_calls_with_nothing_secret_in_reprs(server):
    email = register(server)
    with Client(server.url) as client:
        tokens = client.login(email, DEFAULT_PASSWORD, device="Nightly report")
        assert (tokens.user.email, tokens.token_type, tokens.expires_in) == (email, "Bearer", ACCESS_TOKEN_TTL)
        assert client.tokens == tokens
        assert client.me().id == tokens.user.id
        published = client.publish(f"user:{tokens.user.id}", "note", {"n": 1})  # as the user, with its token
        assert published.channel == f"user:{tokens.user.id}"
        sessions = httpx.get(f"{server.url}/auth/sessions", headers=bearer(tokens.access_token)).json()["sessions"]
        assert [session["device"] for session in sessions] == ["Nightly report"]
        for shown in (repr(client), str(client), repr(tokens)):
            for secret in (tokens.access_token, tokens.refresh_token, DEFAULT_PASSWORD):
                assert secret not in shown
        assert tokens.session_id in repr(client)


def test_a_wrong_password_raises_invalid_credentials_and_holds_no_session(server):
    email = register(server)
    with Client(server.url) as client:
        with pytest.raises(ApiError) as raised:
            client.login(email, "not the password")
        assert (raised.value.status, raised.value.code) == (401, "invalid_credentials")
        assert "not the password" not in str(raised.value) and "not the password" not in repr(raised.value)
        assert client.tokens is None
        with pytest.raises(LoginRequired):
            client.me()


def test_a_second_factor_is_asked_for_and_given_by_code_or_recovery_code(server):
    email = register(server)
    with Client(server.url) as owner:
        headers = bearer(owner.login(email, DEFAULT_PASSWORD).access_token)
        secret = httpx.post(f"{server.url}/auth/mfa/totp/setup", headers=headers).json()["secret"]
        totp = pyotp.TOTP(secret)
        confirmed = httpx.post(f"{server.url}/auth/mfa/totp/confirm", json={"code": totp.now()}, headers=headers)
        assert confirmed.status_code == 200, confirmed.text
        recovery_codes = confirmed.json()["recovery_codes"]

    with Client(server.url) as client:
        with pytest.raises(MfaRequired) as raised:
            client.login(email, DEFAULT_PASSWORD, device="Backup job")
        asked = raised.value
        assert isinstance(asked, ApiError) and (asked.status, asked.code) == (401, "mfa_required")
        assert asked.mfa_token and asked.mfa_token not in str(asked) and asked.mfa_token not in repr(asked)
        assert client.tokens is None
        with pytest.raises(ApiError) as wrong:
            client.login_mfa(asked.mfa_token, code="000000" if totp.now() != "000000" else "111111")
        assert (wrong.value.status, wrong.value.code) == (401, "invalid_mfa_code")
        # The code of the next period: the current one was spent confirming.
        tokens = client.login_mfa(asked.mfa_token, code=totp.at(time.time() + 30))
        assert tokens.user.email == email and client.me().id == tokens.user.id
        sessions = httpx.get(f"{server.url}/auth/sessions", headers=bearer(tokens.access_token)).json()["sessions"]
        assert "Backup job" in [session["device"] for session in sessions]  # the first step's name

    with Client(server.url) as client:
        with pytest.raises(MfaRequired) as raised:
            client.login(email, DEFAULT_PASSWORD)
        with pytest.raises(ValueError, match="code or a recovery_code"):
            client.login_mfa(raised.value.mfa_token)
        tokens = client.login_mfa(raised.value.mfa_token, recovery_code=recovery_codes[0])
        assert client.me().id == tokens.user.id


def test_the_client_renews_before_expiry_and_never_presents_a_used_refresh_token(server, redis_server, monkeypatch):
    email = register(server)
    # The monotonic clock stands still here, as while a machine sleeps: the wall clock times the renewal.
    stopped = session.monotonic()
    monkeypatch.setattr(session, "monotonic", lambda: stopped)
    with Client(server.url) as client:
        first = client.login(email, DEFAULT_PASSWORD)
        # Calls as usual: one of them, once less than half the lifetime is left, renews on the way.
        wait_until(lambda: client.me() and client.tokens != first, timeout=20, interval=0.1, message="a renewal")
        renewed = client.tokens
        assert me_status(server, first.access_token) == 200  # renewed while the old token was still good
        assert renewed.session_id == first.session_id and renewed.refresh_token != first.refresh_token
        assert family_size(redis_server, renewed) == 2  # one rotation

        # Past the old token's expiry the client goes on, with no reuse: the family is alive and grew by one.
        wait_until(lambda: me_status(server, first.access_token) == 401, timeout=20, message="the old token's end")
        explicit = client.refresh()
        assert explicit.refresh_token not in (first.refresh_token, renewed.refresh_token)
        assert client.me().id == first.user.id and family_size(redis_server, explicit) == 3

        # Presenting a used refresh token is what the client never does: the service ends the whole family.
        reused = httpx.post(f"{server.url}/auth/refresh", json={"refresh_token": first.refresh_token})
        assert (reused.status_code, reused.json()["error"]["code"]) == (401, "refresh_token_reused")
        with pytest.raises(ApiError) as ended:
            client.me()
        assert ended.value.status == 401
        with pytest.raises(ApiError) as refused:
            client.refresh()  # its own, current refresh token was revoked with the family
        assert (refused.value.status, refused.value.code) == (401, "refresh_token_reused")
        assert client.tokens is None  # a refused renewal forgets the session rather than present its token again
        with pytest.raises(LoginRequired):
            client.me()


def test_threads_calling_while_the_token_is_due_cause_exactly_one_refresh(server, redis_server, monkeypatch):
    email = register(server)
    # The wall clock stands still here, as if it had been set back: the monotonic clock times the renewal.
    stopped = session.wall_clock()
    monkeypatch.setattr(session, "wall_clock", lambda: stopped)
    with Client(server.url) as client:
        tokens = client.login(email, DEFAULT_PASSWORD)
        due = time.monotonic() + RENEWAL_DUE
        wait_until(lambda: time.monotonic() > due + 0.2, timeout=10, message="the token to be due for renewal")
        answers = in_threads(8, lambda: (client.access_token(), client.me()))
        assert {token for token, _ in answers} == {client.tokens.access_token} != {tokens.access_token}
        assert {user.id for _, user in answers} == {tokens.user.id}
        assert family_size(redis_server, tokens) == 2  # one rotation for all eight


@pytest.fixture(scope="module")
def logged_in_early(server):
    """A client logged in at the module's first test of the service, and the instant it did, for the test that
    needs its access token expired at the service: by that test's turn most of the token's life has passed,
    instead of being waited out there."""
    email = register(server)
    with Client(server.url) as client:
        tokens = client.login(email, DEFAULT_PASSWORD)
        yield client, tokens, session.SessionTokens.now()


@pytest.fixture(autouse=True)
def _log_in_early(request):
    """Start `logged_in_early` with the first test that uses the service (the others need no service)."""
    if "server" in request.fixturenames:
        request.getfixturevalue("logged_in_early")


def test_a_token_refused_as_expired_is_renewed_once_for_every_thread(
    server, redis_server, monkeypatch, logged_in_early
):
    """As when the client's clocks lag behind the service's: the client takes an expired access token for a
    fresh one, until the service answers 401 token_expired."""
    client, tokens, stopped = logged_in_early
    # The client's clocks stand still at the instant it logged in.
    monkeypatch.setattr(session, "monotonic", lambda: stopped.monotonic)
    monkeypatch.setattr(session, "wall_clock", lambda: stopped.wall)
    wait_until(lambda: me_status(server, tokens.access_token) == 401, timeout=20, message="the token's end")
    assert client.access_token() == tokens.access_token  # still fresh, as far as the client knows
    users = in_threads(8, client.me)  # each refused once, then sent again with the one renewal's token
    assert {user.id for user in users} == {tokens.user.id}
    assert client.tokens.access_token != tokens.access_token
    assert family_size(redis_server, tokens) == 2


def test_logout_ends_this_session_and_logout_all_every_one(server):
    email = register(server)
    with Client(server.url) as client, Client(server.url) as other:
        tokens = client.login(email, DEFAULT_PASSWORD)
        kept = other.login(email, DEFAULT_PASSWORD)
        assert me_status(server, tokens.access_token) == 200
        client.logout()
        assert me_status(server, tokens.access_token) == 401  # the session is gone, its token with it
        refreshed = httpx.post(f"{server.url}/auth/refresh", json={"refresh_token": tokens.refresh_token})
        assert refreshed.status_code == 401
        assert client.tokens is None
        with pytest.raises(LoginRequired):
            client.me()
        client.logout()  # no session: nothing to do
        assert other.me().id == kept.user.id  # another device's session goes on

        again = client.login(email, DEFAULT_PASSWORD)
        client.logout_all()
        for ended in (again, kept):
            assert me_status(server, ended.access_token) == 401
        with pytest.raises(ApiError) as raised:
            other.me()
        assert raised.value.status == 401


@pytest.mark.parametrize("transport", ["sse", "long-poll"])
def test_a_reader_keeps_receiving_across_a_renewal(server, transport):
    email = register(server)
    with Client(server.url) as client:
        tokens = client.login(email, DEFAULT_PASSWORD)
        channel = f"user:{tokens.user.id}"
        used: list[str] = []

        def current_token() -> str:
            used.append(client.access_token())
            return used[-1]

        collector = Collector(EventReader(server.url, current_token, transport=transport, wait_seconds=2))
        try:
            first = client.publish(channel, "n", {"n": 1}).id
            assert [event.id for event in collector.events(1)] == [first]
            # The stream ends when its token expires (a long poll is refused); the reader asks for the token
            # again, and the client hands out a renewed one.
            wait_until(lambda: len(set(used)) >= 2, timeout=30, message="a connection with a renewed token")
            if transport == "sse":
                assert me_status(server, tokens.access_token) == 401  # it lasted as long as its first token
            second = client.publish(channel, "n", {"n": 2}).id
            assert [event.id for event in collector.events(1)] == [second]
        finally:
            collector.stop()
        assert collector.received.empty() and collector.error is None


def test_an_exchanged_session_is_renewed_and_ended_like_a_login(server, module_cli, redis_server):
    key = create_key(module_cli, "issuers", ["issuers:manage"], [])
    signer = Signer.hmac()
    name = f"product-{secrets.token_hex(4)}"
    issuer = f"https://{name}.example"
    body = {"issuer": issuer, "audience": AUDIENCE, "algorithms": ["HS256"], "secret": signer.private}
    trusted = httpx.put(f"{server.url}/admin/issuers/{name}", json=body, headers=bearer(key))
    assert trusted.status_code == 200, trusted.text
    with Client(server.url) as client:
        tokens = client.exchange(signer.sign(claims(issuer, "auth0|grace")))
        assert client.tokens == tokens and client.me().id == tokens.user.id
        renewed = client.refresh()  # the one renewal of every session: it times and rotates this one alike
        assert renewed.session_id == tokens.session_id and client.tokens == renewed
        assert client.me().id == tokens.user.id and family_size(redis_server, renewed) == 2
        client.logout()
        assert me_status(server, renewed.access_token) == 401


def test_a_session_without_a_refresh_token_says_how_to_get_a_new_one():
    user = {"id": "7", "email": None, "role": "user"}
    answer = {"access_token": "at", "token_type": "Bearer", "expires_in": 900, "session_id": "s1", "user": user}
    tokens = Tokens.from_json(answer)
    assert (tokens.refresh_token, tokens.refresh_expires_in) == (None, None)
    held = session.SessionTokens(lambda _: pytest.fail("there is no refresh token to present"), refresh_before=60)
    held.hold(tokens, session.SessionTokens.now())
    assert held.access_token() == "at"  # fresh: nothing to renew yet
    with pytest.raises(LoginRequired, match="exchange a new subject token"):
        held.renew()


def test_a_reader_waits_out_a_renewal_that_could_not_reach_the_service(server):
    email = register(server)
    with Client(server.url) as client:
        tokens = client.login(email, DEFAULT_PASSWORD)
        asked: list[int] = []

        def token_once_unreachable() -> str:
            asked.append(1)
            if len(asked) == 2:  # the stream's first connection: as if the renewal had met a dropped connection
                raise ServiceUnreachable("POST /auth/refresh: connection refused")
            return client.access_token()

        collector = Collector(EventReader(server.url, token_once_unreachable, max_backoff=1))
        try:
            sent = client.publish(f"user:{tokens.user.id}", "n", {"n": 1}).id
            assert [event.id for event in collector.events(1)] == [sent]  # retried as any transient failure
        finally:
            collector.stop()
        assert len(asked) >= 3 and collector.error is None


@pytest.fixture
def lossy_proxy(server):
    """A relay in front of the service, for a client that is to lose a renewal's answer or not reach it."""
    proxy = LossyProxy(server.url)
    proxy.start()
    yield proxy
    proxy.close()


def reuse_alarms(redis_server, user_id: str) -> list[str]:
    """The user's audit entries that say a used refresh token came back (and its session was ended)."""
    entries = redis_server.client().zrange(Keys.audit_subject(user_id), 0, -1)
    return [entry for entry in entries if '"refresh.reuse_detected"' in entry]


def session_alive(redis_server, tokens: Tokens) -> bool:
    return bool(redis_server.client().exists(Keys.session(tokens.user.id, tokens.session_id)))


def test_a_renewal_that_never_reached_the_service_is_tried_again_with_the_same_refresh_token(
    server, redis_server, lossy_proxy
):
    email = register(server)
    with Client(lossy_proxy.url) as client:
        tokens = client.login(email, DEFAULT_PASSWORD)
        lossy_proxy.stop()  # connection refused: the request never leaves the client
        with pytest.raises(ServiceUnreachable) as unreachable:
            client.refresh()
        assert unreachable.value.maybe_received is False
        assert client.tokens == tokens  # kept, to present again
        assert lossy_proxy.refresh_tokens == [] and family_size(redis_server, tokens) == 1  # never presented

        lossy_proxy.start()  # on the same port
        renewed = client.refresh()
        assert lossy_proxy.refresh_tokens == [tokens.refresh_token]  # its first presentation, which rotates it
        assert renewed.session_id == tokens.session_id and renewed.refresh_token != tokens.refresh_token
        assert family_size(redis_server, renewed) == 2 and client.me().id == tokens.user.id
        assert reuse_alarms(redis_server, tokens.user.id) == []


@pytest.mark.parametrize("loss", ["bad_gateway", "no_answer", "reset", "silence", "not_json"])
def test_a_renewal_whose_answer_is_lost_forgets_the_session_and_never_presents_its_refresh_token_again(
    server, redis_server, lossy_proxy, loss
):
    email = register(server)
    # "silence" lasts until the client's read time-out: short, yet ample for the login and the relayed refresh
    with Client(lossy_proxy.url, timeout=2.5) as client:
        tokens = client.login(email, DEFAULT_PASSWORD)
        lossy_proxy.lose = loss  # the request reaches the service, which rotates the token; the answer is lost
        with pytest.raises(LoginRequired, match="log in") as lost:
            client.refresh()
        assert tokens.refresh_token not in str(lost.value)
        assert client.tokens is None
        for call in (client.access_token, client.refresh, client.me):
            with pytest.raises(LoginRequired):
                call()
        assert lossy_proxy.refresh_tokens == [tokens.refresh_token]  # presented once, never again

        # The service did rotate it, and the session lives on: no false theft alarm ended it.
        assert family_size(redis_server, tokens) == 2 and session_alive(redis_server, tokens)
        assert reuse_alarms(redis_server, tokens.user.id) == []
        # What presenting it again would have done: the session ends as stolen, and the audit log says so.
        reused = httpx.post(f"{server.url}/auth/refresh", json={"refresh_token": tokens.refresh_token})
        assert (reused.status_code, reused.json()["error"]["code"]) == (401, "refresh_token_reused")
        assert len(reuse_alarms(redis_server, tokens.user.id)) == 1 and not session_alive(redis_server, tokens)


def test_a_reader_ends_with_login_required_when_a_renewal_answer_is_lost(server, redis_server, lossy_proxy):
    email = register(server)
    with Client(lossy_proxy.url) as client:
        tokens = client.login(email, DEFAULT_PASSWORD)
        lossy_proxy.lose = "bad_gateway"
        # The reader connects to the service itself; only the renewals its token function makes go by the proxy.
        reader = EventReader(server.url, client.access_token, transport="long-poll", wait_seconds=1, max_backoff=1)
        collector = Collector(reader)
        try:
            ended = collector.raised(timeout=30)  # once the token is due, at its first renewal
        finally:
            collector.stop()
        assert isinstance(ended, LoginRequired), ended
        assert lossy_proxy.refresh_tokens == [tokens.refresh_token]
        assert session_alive(redis_server, tokens) and reuse_alarms(redis_server, tokens.user.id) == []


@pytest.mark.parametrize(
    ("make_failure", "kept"),
    [
        (lambda: ServiceUnreachable("connection refused", maybe_received=False), True),
        (lambda: ApiError(429, "rate_limited", "Too many requests.", retry_after=3), True),
        (lambda: ApiError(422, "validation_failed", "refresh_token is required."), True),
        (lambda: ServiceUnreachable("read time-out", maybe_received=True), False),
        (lambda: ApiError(503, "unavailable", "Try again later."), False),
        (lambda: ProtocolError("POST /auth/refresh: the answer is not JSON"), False),
    ],
    ids=["refused", "429", "422", "read-timeout", "503", "unreadable"],
)
def test_a_failed_renewal_keeps_the_refresh_token_only_when_the_service_certainly_did_not_rotate_it(make_failure, kept):
    user = {"id": "7", "email": None, "role": "user"}
    answer = {"access_token": "at", "token_type": "Bearer", "expires_in": 900, "session_id": "s1", "user": user}
    tokens = Tokens.from_json({**answer, "refresh_token": "rt", "refresh_expires_in": 3600})
    failure = make_failure()

    def fail(_: Tokens) -> Tokens:
        raise failure

    held = session.SessionTokens(fail, refresh_before=60)
    held.hold(tokens, session.SessionTokens.now())
    if kept:
        with pytest.raises(type(failure)):
            held.renew()
        assert held.tokens == tokens
    else:
        with pytest.raises(LoginRequired, match="log in") as raised:
            held.renew()
        assert raised.value.__cause__ is failure and held.tokens is None
