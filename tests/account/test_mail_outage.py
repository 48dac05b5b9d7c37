"""An SMTP server that is down for a while: requests still answer at once, mail waits in Redis and is
retried, and when the server is back every message arrives exactly once. Implicit TLS (smtps) here."""

from __future__ import annotations

import pytest
import requests

from app.mail.backends import TransientMailError
from app.redis import Keys
from tests.account.conftest import mail_env
from tests.conftest import https_client
from tests.mailserver import SmtpServer
from tests.servers import LiveServer, wait_until
from tests.utils import random_email


@pytest.fixture(scope="module")
def down_smtp(smtp_certificate, redis_server):
    """An smtps server on a port where nothing listens yet (the test starts it); one per Redis mode."""
    server = SmtpServer(smtp_certificate, mode="smtps", auth=False)
    yield server
    server.stop()


@pytest.fixture
def outage_server(base_env, down_smtp, smtp_certificate, tmp_path_factory):
    """For one test only: its mail sender would otherwise claim the jobs the later tests process themselves."""
    live = LiveServer(
        {**base_env, **mail_env(down_smtp, smtp_certificate, MAIL_RETRY_SCHEDULE="1")},
        workers=2,
        log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log",
    )
    live.start()
    yield live
    live.stop()


def attempts(redis_client) -> list[int]:
    return [int(redis_client.hget(key, "attempts") or 0) for key in redis_client.scan_iter(Keys.mail_job("*"))]


def test_mail_queued_while_smtp_is_down_arrives_once_when_it_is_back(outage_server, down_smtp, redis_client, rdb):
    # `rdb`: an empty mail queue, so that only this test's four jobs are counted (not one another module left)
    base = outage_server.url
    addresses = [random_email() for _ in range(3)]
    for address in addresses:
        answer = requests.post(f"{base}/auth/register", json={"email": address, "password": "correct horse battery"})
        assert answer.status_code == 201  # the answer does not wait for mail
    assert requests.post(f"{base}/auth/password/forgot", json={"email": addresses[0]}).status_code == 202

    # Every job is tried, fails (connection refused) and is kept for another attempt.
    wait_until(lambda: len(attempts(redis_client)) == 4 and min(attempts(redis_client)) >= 2, timeout=15)
    assert down_smtp.received == []

    down_smtp.start()
    for address in addresses:
        down_smtp.wait_for(address)
    wait_until(lambda: redis_client.zcard(Keys.mail_queue()) == 0, message="the queue to empty")
    assert list(redis_client.scan_iter(Keys.mail_job("*"))) == []  # nothing left to send, so nothing more will come
    for address in addresses:
        subjects = sorted(m.message["Subject"] for m in down_smtp.to(address))
        expected = ["Confirm your e-mail address"] + (["Reset your password"] if address == addresses[0] else [])
        assert subjects == sorted(expected), address  # each exactly once
    reset_mail = next(m for m in down_smtp.to(addresses[0]) if m.message["Subject"] == "Reset your password")
    answer = requests.post(f"{base}/auth/password/reset", json={"token": reset_mail.token(), "new_password": "x" * 12})
    assert answer.status_code == 204  # the link made at the successful attempt works


def test_a_job_deleted_while_it_is_being_sent_stays_deleted(make_app, rdb, monkeypatch):
    """A job whose record goes while an attempt is under way (deleted, expired, or flushed) must not come back
    as a record of attempts alone, which the next sender would fail to build."""
    app = make_app(SMTP_URL="smtp://127.0.0.1:1", PUBLIC_BASE_URL="https://auth.example.test", SMTP_STARTTLS="never")
    queue = app.extensions["mail_queue"]
    answer = https_client(app).post("/auth/register", json={"email": random_email(), "password": "correct horse"})
    assert answer.status_code == 201
    [job_id] = rdb.zrange(Keys.mail_queue(), 0, -1)

    def refused_after_the_job_went(message):
        rdb.delete(Keys.mail_job(job_id))
        raise TransientMailError("connection refused")

    monkeypatch.setattr(queue.backend, "send", refused_after_the_job_went)
    queue.process(job_id)
    assert not rdb.exists(Keys.mail_job(job_id))
    assert rdb.zscore(Keys.mail_queue(), job_id) is None
