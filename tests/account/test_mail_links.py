"""Where mail links point, and when mail may go out in plain text.

Links point at PUBLIC_BASE_URL (required with SMTP_URL) or, without SMTP_URL, at the development address;
never at the Host a request names, which its sender chooses. `SMTP_STARTTLS=never` lets a plain-text mail
catcher on loopback (aiosmtpd, as a developer runs one) get mail; by default it gets nothing.
"""

from __future__ import annotations

import logging
from email.message import EmailMessage

import pytest
import requests

from app.mail import DEVELOPMENT_BASE_URL
from app.mail.backends import TransientMailError
from app.redis import Keys
from tests.account.conftest import MAIL_FROM, PUBLIC_BASE_URL
from tests.conftest import https_client
from tests.mailserver import SmtpServer
from tests.servers import LiveServer
from tests.utils import DEFAULT_PASSWORD, random_email

FORGED = "attacker.example"


@pytest.fixture(scope="module")
def catcher(smtp_certificate, redis_server):
    """A development mail catcher: plain SMTP, no STARTTLS, no AUTH, on loopback."""
    server = SmtpServer(smtp_certificate, mode="plain", auth=False).start()
    yield server
    server.stop()


@pytest.fixture
def plain_server(base_env, catcher, tmp_path_factory):
    """gunicorn whose mail goes to the catcher in plain text, as SMTP_STARTTLS=never allows.

    For one test only: its mail sender would otherwise claim the jobs the later tests queue and process
    themselves, and send them in plain text."""
    env = {
        **base_env,
        "SMTP_URL": catcher.url(),
        "SMTP_STARTTLS": "never",
        "MAIL_FROM": MAIL_FROM,
        "PUBLIC_BASE_URL": PUBLIC_BASE_URL,
    }
    live = LiveServer(env, workers=1, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


def test_a_forged_host_never_reaches_a_mailed_link(plain_server, catcher):
    """Host-header poisoning: asking for a victim's reset with a forged Host (or X-Forwarded-Host from
    a trusted proxy's address) must not make the mailed link lead to the forger's site."""
    email = random_email()
    forged = {"Host": FORGED, "X-Forwarded-Host": FORGED, "X-Forwarded-Proto": "http"}
    registered = requests.post(
        f"{plain_server.url}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD}, headers=forged
    )
    assert registered.status_code == 201, registered.text
    forgot = requests.post(f"{plain_server.url}/auth/password/forgot", json={"email": email}, headers=forged)
    assert forgot.status_code == 202
    mails = catcher.wait_for(email, count=2)  # over plain SMTP: SMTP_STARTTLS=never
    for mail in mails:
        assert mail.link().startswith(f"{PUBLIC_BASE_URL}/"), mail.link()
        assert FORGED not in mail.text and FORGED not in mail.html


def test_without_starttls_never_a_plain_text_server_gets_nothing(make_app, catcher):
    """The default (SMTP_STARTTLS=always): no fallback to plain text, the mail waits for a retry."""
    app = make_app(SMTP_URL=catcher.url(), PUBLIC_BASE_URL=PUBLIC_BASE_URL)
    assert app.config["SETTINGS"].mail.starttls == "always"
    email = random_email()
    response = https_client(app).post("/auth/register", json={"email": email, "password": DEFAULT_PASSWORD})
    assert response.status_code == 201
    queue = app.extensions["mail_queue"]
    [job_id] = app.extensions["redis"].zrange(Keys.mail_queue(), 0, -1)
    queue.process(job_id)
    job = app.extensions["redis"].hgetall(Keys.mail_job(job_id))
    assert job["attempts"] == "1" and "STARTTLS" in job["last_error"]  # kept for a retry, not sent
    assert catcher.to(email) == []
    with pytest.raises(TransientMailError, match="STARTTLS"):
        queue.backend.send(_any_message(email))
    assert catcher.to(email) == []


def test_logged_mail_links_use_the_development_address_not_the_request_host(make_app, caplog):
    """No SMTP_URL and no PUBLIC_BASE_URL (development, tests): mail goes to the log, its links to the
    development address whatever Host or X-Forwarded-Host the request named."""
    app = make_app()
    email = random_email()
    client = https_client(app)
    response = client.post(
        "/auth/register",
        json={"email": email, "password": DEFAULT_PASSWORD},
        base_url=f"https://{FORGED}",
        headers={"X-Forwarded-Host": FORGED},
    )
    assert response.status_code == 201
    [job_id] = app.extensions["redis"].zrange(Keys.mail_queue(), 0, -1)
    with caplog.at_level(logging.INFO, logger="app.mail.backends"):
        app.extensions["mail_queue"].process(job_id)
    assert f"{DEVELOPMENT_BASE_URL}/verify-email#token=" in caplog.text
    assert FORGED not in caplog.text


def _any_message(to: str) -> EmailMessage:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = MAIL_FROM, to, "Hello"
    message.set_content("no link")
    return message
