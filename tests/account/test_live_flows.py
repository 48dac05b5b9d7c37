"""The lifecycle against a live gunicorn (two workers): verification and reset mails end to end (its
sender mails a real SMTP server with STARTTLS and AUTH, and the tests read the link out of the message
that arrived), and administration closing a user's live connections."""

from __future__ import annotations

import hashlib
import statistics
import time

import requests

from app.redis import Keys
from tests.account.conftest import MAIL_FROM, PUBLIC_BASE_URL
from tests.events.clients import SSE, Api
from tests.servers import wait_until
from tests.utils import DEFAULT_PASSWORD, random_email, redis_snapshot

NEW_PASSWORD = "a brand new passphrase"


def register(base: str, email: str | None = None) -> str:
    email = email or random_email()
    response = requests.post(f"{base}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD})
    assert response.status_code == 201, response.text
    return email


def forgot(base: str, email: str) -> requests.Response:
    return requests.post(f"{base}/auth/password/forgot", json={"email": email})


def reset(base: str, token: str, password: str = NEW_PASSWORD) -> requests.Response:
    return requests.post(f"{base}/auth/password/reset", json={"token": token, "new_password": password})


def verify(base: str, token: str) -> requests.Response:
    return requests.post(f"{base}/auth/email/verify", json={"token": token})


def login(base: str, email: str, password: str = DEFAULT_PASSWORD) -> requests.Response:
    return requests.post(f"{base}/auth/login", json={"email": email, "password": password, "transport": "body"})


def queue_empty(redis_client) -> bool:
    return redis_client.zcard(Keys.mail_queue()) == 0


def test_registration_mails_a_verification_link_that_works_once(mail_server, smtp, redis_client):
    email = register(mail_server.url)
    [mail] = smtp.wait_for(email)
    message = mail.message
    assert message["From"] == MAIL_FROM and message["To"] == email and mail.recipients == [email]
    assert mail.mail_from == "accounts@example.test"
    assert message["Subject"] == "Confirm your e-mail address" and message["Message-ID"].endswith("@example.test>")
    assert message.get_content_type() == "multipart/alternative"
    link = mail.link()
    assert link.startswith(f"{PUBLIC_BASE_URL}/verify-email#token=")
    assert f'href="{link}"' in mail.html  # the HTML part carries the same link
    token = mail.token()
    assert len(token) >= 43  # 256 bits, base64url
    assert smtp.logins  # it authenticated, after STARTTLS (the server allows AUTH only then)

    # Only the token's SHA-256 is stored, never the token itself (nor in the queue).
    snapshot = redis_snapshot(redis_client)
    user_id = token.partition(".")[0]
    assert snapshot[Keys.user_mail_token(user_id, "verify")]["hash"] == hashlib.sha256(token.encode()).hexdigest()
    assert token not in repr(snapshot)

    api = Api(mail_server.url, email=email)
    me = requests.get(f"{mail_server.url}/auth/me", headers=api.auth).json()["user"]
    assert me["email_verified"] is False
    assert verify(mail_server.url, token).status_code == 204
    me = requests.get(f"{mail_server.url}/auth/me", headers=api.auth).json()["user"]
    assert me["email_verified"] is True
    again = verify(mail_server.url, token)
    assert again.status_code == 400 and again.json()["error"]["code"] == "invalid_token"


def test_resending_replaces_the_older_link(mail_server, smtp):
    email = register(mail_server.url)
    [first] = smtp.wait_for(email)
    api = Api(mail_server.url, email=email)
    resent = requests.post(f"{mail_server.url}/auth/email/verify/resend", headers=api.auth)
    assert resent.status_code == 202 and resent.content == b""
    second = smtp.wait_for(email, count=2)[1]
    assert second.token() != first.token()
    assert verify(mail_server.url, first.token()).json()["error"]["code"] == "invalid_token"
    assert verify(mail_server.url, second.token()).status_code == 204
    already = requests.post(f"{mail_server.url}/auth/email/verify/resend", headers=api.auth)
    assert already.status_code == 409


def test_reset_ends_every_session_and_closes_live_connections(mail_server, smtp):
    email = register(mail_server.url)
    phone, laptop = (
        Api(mail_server.url, email=email, device="phone"),
        Api(mail_server.url, email=email, device="laptop"),
    )
    stream = SSE(mail_server.url, laptop.auth)
    stream.next(skip_comments=False)

    answer = forgot(mail_server.url, email.upper())  # addresses are compared in lower case
    assert answer.status_code == 202 and answer.content == b""
    [mail] = [m for m in smtp.wait_for(email, count=2) if m.message["Subject"] == "Reset your password"]
    assert mail.link().startswith(f"{PUBLIC_BASE_URL}/reset-password#token=")
    assert reset(mail_server.url, mail.token()).status_code == 204

    assert stream.next_event(timeout=2)["event"] == "session_ended"  # live connections close at once
    for device in (phone, laptop):
        assert requests.get(f"{mail_server.url}/auth/me", headers=device.auth).status_code == 401
        refreshed = requests.post(f"{mail_server.url}/auth/refresh", json={"refresh_token": device.refresh_token})
        assert refreshed.status_code == 401
    assert login(mail_server.url, email).json()["error"]["code"] == "invalid_credentials"
    new_login = login(mail_server.url, email, NEW_PASSWORD)
    assert new_login.status_code == 200
    assert new_login.json()["user"]["email_verified"] is True  # the mail reached its owner
    reused = reset(mail_server.url, mail.token(), "yet another passphrase")
    assert reused.status_code == 400 and reused.json()["error"]["code"] == "invalid_token"
    assert login(mail_server.url, email, NEW_PASSWORD).status_code == 200


def test_a_newer_reset_link_invalidates_the_older_one(mail_server, smtp):
    email = register(mail_server.url)
    smtp.wait_for(email)  # the verification mail
    assert forgot(mail_server.url, email).status_code == 202
    first = smtp.wait_for(email, count=2)[1]
    assert forgot(mail_server.url, email).status_code == 202
    second = smtp.wait_for(email, count=3)[2]
    older = reset(mail_server.url, first.token())
    assert older.status_code == 400 and older.json()["error"]["code"] == "invalid_token"
    assert reset(mail_server.url, second.token()).status_code == 204


def test_forgot_answers_alike_and_mails_only_known_addresses(mail_server, smtp, redis_client):
    known, unknown = register(mail_server.url), random_email()
    smtp.wait_for(known)
    answers = [forgot(mail_server.url, unknown), forgot(mail_server.url, known)]
    assert [a.status_code for a in answers] == [202, 202]
    assert answers[0].content == answers[1].content == b""
    assert {k: v for k, v in answers[0].headers.items() if k not in ("Date", "X-Request-ID")} == {
        k: v for k, v in answers[1].headers.items() if k not in ("Date", "X-Request-ID")
    }
    smtp.wait_for(known, count=2)  # the known address's reset mail arrives...
    wait_until(lambda: queue_empty(redis_client), message="the mail queue to empty")
    assert smtp.to(unknown) == []  # ...and with every job done, none went to the unknown one


def test_forgot_takes_the_same_time_for_known_and_unknown_addresses(mail_server, smtp, redis_client):
    """The request only queues a job for the address as typed; the sender looks the account up later."""
    known = [register(mail_server.url) for _ in range(3)]
    session = requests.Session()
    timings = {"known": [], "unknown": []}
    for round_ in range(15):
        for kind in ("known", "unknown"):
            address = known[round_ % 3] if kind == "known" else random_email()
            started = time.perf_counter()
            assert session.post(f"{mail_server.url}/auth/password/forgot", json={"email": address}).status_code == 202
            timings[kind].append(time.perf_counter() - started)
    known_median, unknown_median = statistics.median(timings["known"]), statistics.median(timings["unknown"])
    # A wide margin: the paths are the same code; what is ruled out is a lookup, hash or send on one only.
    assert abs(known_median - unknown_median) < 0.5 * max(known_median, unknown_median) + 0.005, timings
    wait_until(lambda: queue_empty(redis_client), timeout=30, message="the mail queue to empty")


def test_reset_links_live_thirty_minutes(mail_server, smtp, redis_client):
    email = register(mail_server.url)
    assert forgot(mail_server.url, email).status_code == 202
    mail = [m for m in smtp.wait_for(email, count=2) if m.message["Subject"] == "Reset your password"][0]
    key = Keys.user_mail_token(mail.token().partition(".")[0], "reset")
    assert redis_client.hget(key, "hash") == hashlib.sha256(mail.token().encode()).hexdigest()
    assert 1790 <= redis_client.ttl(key) <= 1800
    assert abs(float(redis_client.hget(key, "expires_at")) - (time.time() + 1800)) < 10
    # Thirty minutes later (the record says so even where Redis has not expired it yet):
    redis_client.hset(key, "expires_at", f"{time.time() - 1:.3f}")
    late = reset(mail_server.url, mail.token())
    assert late.status_code == 400 and late.json()["error"]["code"] == "invalid_token"
    assert login(mail_server.url, email).status_code == 200  # the password did not change


def test_verification_links_live_a_day(mail_server, smtp, redis_client):
    email = register(mail_server.url)
    [mail] = smtp.wait_for(email)
    key = Keys.user_mail_token(mail.token().partition(".")[0], "verify")
    assert redis_client.hget(key, "hash") == hashlib.sha256(mail.token().encode()).hexdigest()
    assert 24 * 3600 - 10 <= redis_client.ttl(key) <= 24 * 3600
    redis_client.delete(key)  # what Redis does when it expires
    assert verify(mail_server.url, mail.token()).json()["error"]["code"] == "invalid_token"


def test_bad_reset_requests_change_nothing(mail_server, smtp):
    email = register(mail_server.url)
    assert forgot(mail_server.url, email).status_code == 202
    mail = [m for m in smtp.wait_for(email, count=2) if m.message["Subject"] == "Reset your password"][0]
    base = mail_server.url
    cases = [
        ({"token": "unknown-" + "x" * 40, "new_password": NEW_PASSWORD}, 400, "invalid_token"),
        ({"token": "x" * 5000, "new_password": NEW_PASSWORD}, 400, "invalid_token"),
        ({"token": "", "new_password": NEW_PASSWORD}, 400, "invalid_token"),
        ({"token": mail.token(), "new_password": "short"}, 422, "validation_failed"),
        ({"token": mail.token(), "new_password": "x" * 1025}, 422, "validation_failed"),
        ({"token": mail.token()}, 400, "bad_request"),
        ({"token": 123, "new_password": NEW_PASSWORD}, 400, "bad_request"),
        ({"new_password": NEW_PASSWORD}, 400, "bad_request"),
    ]
    for body, status, code in cases:
        answer = requests.post(f"{base}/auth/password/reset", json=body)
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), body
    malformed = requests.post(f"{base}/auth/password/reset", data="{", headers={"Content-Type": "application/json"})
    assert malformed.status_code == 400
    for body in ({"email": "not an address"}, {"email": "a\x00b@example.com"}):
        assert forgot(base, body["email"]).status_code == 422
    assert requests.post(f"{base}/auth/password/forgot", json={"email": 5}).status_code == 400
    # None of that used or spoiled the token:
    assert reset(base, mail.token()).status_code == 204


def test_deleting_or_changing_the_role_of_a_user_closes_their_live_connections(mail_server, module_cli):
    admin_email = random_email()
    created = module_cli("users", "create", "--email", admin_email, "--password", DEFAULT_PASSWORD, "--role", "admin")
    assert created.returncode == 0, created.stderr
    admin = Api(mail_server.url, email=admin_email)
    user = Api(mail_server.url)

    stream = SSE(mail_server.url, user.auth)
    stream.next(skip_comments=False)
    promoted = requests.patch(
        f"{mail_server.url}/admin/users/{user.user_id}", json={"role": "admin"}, headers=admin.auth
    )
    assert promoted.status_code == 200
    assert stream.next_event(timeout=2)["event"] == "session_ended"  # reconnect with the admin's channels
    assert requests.get(f"{mail_server.url}/admin/users", headers=user.auth).status_code == 200  # session kept

    stream = SSE(mail_server.url, user.auth)
    stream.next(skip_comments=False)
    assert requests.delete(f"{mail_server.url}/admin/users/{user.user_id}", headers=admin.auth).status_code == 204
    assert stream.next_event(timeout=2)["event"] == "session_ended"
    assert requests.get(f"{mail_server.url}/auth/me", headers=user.auth).status_code == 401
    assert login(mail_server.url, user.email).status_code == 401
