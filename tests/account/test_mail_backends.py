"""The SMTP back-end against real servers that misbehave, the log back-end, and the mail settings."""

from __future__ import annotations

import logging
import ssl
from email.message import EmailMessage

import pytest

from app.mail.backends import LogBackend, Mail, PermanentMailError, SmtpBackend, TransientMailError
from app.settings import SettingsError, load_settings
from tests.mailserver import SMTP_PASSWORD, SMTP_USER, SmtpServer

STRONG = "s" * 32


def message(to: str = "someone@example.com") -> Mail:
    mail = Mail(to)
    mail["From"], mail["Subject"] = "a@example.test", "Hello"
    mail.set_content("https://auth.example.test/reset-password#token=secret-token")
    return mail


@pytest.fixture
def trusted(monkeypatch, smtp_certificate):
    monkeypatch.setenv("SSL_CERT_FILE", str(smtp_certificate[0]))


def backend(server: SmtpServer, url: str | None = None) -> SmtpBackend:
    return SmtpBackend(url or server.url(), "a@example.test", timeout=5)


def test_starttls_with_auth_delivers(smtp_certificate, trusted):
    server = SmtpServer(smtp_certificate).start()
    try:
        backend(server).send(message())
        assert server.wait_for("someone@example.com")[0].message["Subject"] == "Hello"
        assert server.logins == [SMTP_USER]
    finally:
        server.stop()


def test_a_backend_reads_its_certificates_at_its_first_message_only(smtp_certificate, trusted, monkeypatch):
    server = SmtpServer(smtp_certificate).start()
    built, create = [], ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *args, **kw: built.append(1) or create(*args, **kw))
    try:
        smtp = backend(server)
        for n in range(3):
            smtp.send(message(f"reader-{n}@example.com"))
        assert all(server.wait_for(f"reader-{n}@example.com") for n in range(3))
        assert len(built) == 1
    finally:
        server.stop()


# A To header that parses into other mailboxes: an encoded word decodes to a comma and a second address.
TAMPERED_TO = "=?utf-8?q?attacker=40evil.example=2c_?=victim@example.com"


def test_the_envelope_goes_to_the_message_recipient_alone_whatever_its_to_header_says(smtp_certificate, trusted):
    tampered = message("victim@example.com")
    tampered.replace_header("To", TAMPERED_TO)
    parsed = {address.addr_spec for address in tampered["To"].addresses}
    assert parsed == {"attacker@evil.example", "victim@example.com"}  # what smtplib alone would mail
    server = SmtpServer(smtp_certificate).start()
    try:
        backend(server).send(tampered)
        [received] = server.wait_for("victim@example.com")
        assert received.recipients == ["victim@example.com"] and received.mail_from == "a@example.test"
        assert server.to("attacker@evil.example") == []
    finally:
        server.stop()


def test_a_message_that_names_no_recipient_is_never_sent(smtp_certificate, trusted):
    untold = EmailMessage()
    untold["From"], untold["To"], untold["Subject"] = "a@example.test", "someone@example.com", "Hello"
    untold.set_content("no recipient but the header")
    server = SmtpServer(smtp_certificate).start()
    try:
        with pytest.raises(PermanentMailError, match="no recipient"):
            backend(server).send(untold)
        with pytest.raises(PermanentMailError, match="no recipient"):
            LogBackend().send(untold)
        assert server.received == []
        backend(server).send(message())  # the same server takes a message that names its recipient
        assert server.wait_for("someone@example.com")
    finally:
        server.stop()


def test_a_server_without_starttls_gets_nothing_in_plain_text(smtp_certificate, trusted):
    server = SmtpServer(smtp_certificate, mode="plain", auth=False).start()
    try:
        with pytest.raises(TransientMailError, match="STARTTLS"):
            backend(server, f"smtp://127.0.0.1:{server.port}").send(message())
        with pytest.raises(TransientMailError, match="STARTTLS"):  # the default, said out loud
            SmtpBackend(server.url(), "a@example.test", timeout=5, starttls="always").send(message())
        assert server.received == []
    finally:
        server.stop()


def test_starttls_never_delivers_to_a_plain_text_mail_catcher():
    """SMTP_STARTTLS=never: a development mail catcher (plain aiosmtpd on loopback) gets the mail."""
    server = SmtpServer(None, mode="plain", auth=False).start()
    try:
        plain = SmtpBackend(server.url(), "a@example.test", timeout=5, starttls="never")
        assert "plain text" in plain.describe()
        plain.send(message())
        [received] = server.wait_for("someone@example.com")
        assert "#token=secret-token" in received.text
    finally:
        server.stop()


def test_an_untrusted_certificate_is_refused(smtp_certificate, monkeypatch, tmp_path):
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "no-such-bundle.pem"))
    server = SmtpServer(smtp_certificate).start()
    try:
        with pytest.raises(TransientMailError):
            backend(server).send(message())
        assert server.received == [] and server.logins == []  # the password never left
    finally:
        server.stop()


def test_wrong_credentials_are_kept_for_retry(smtp_certificate, trusted):
    server = SmtpServer(smtp_certificate).start()
    try:
        url = server.url().replace(SMTP_PASSWORD, "wrong-password")
        with pytest.raises(TransientMailError):  # refused (535), or cut off after it: kept for retry
            backend(server, url).send(message())
        assert server.received == []
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("answer", "kind"), [("550 no such mailbox", PermanentMailError), ("451 try later", TransientMailError)]
)
def test_refused_recipients_are_permanent_or_transient_by_code(smtp_certificate, trusted, answer, kind):
    server = SmtpServer(smtp_certificate)
    server.refuse_recipients = answer
    server.start()
    try:
        with pytest.raises(kind):
            backend(server).send(message())
    finally:
        server.stop()


def test_nothing_listening_is_transient():
    closed = SmtpBackend("smtp://127.0.0.1:9", "a@example.test", timeout=2)
    with pytest.raises(TransientMailError, match="cannot connect"):
        closed.send(message())


def test_the_log_backend_writes_whole_mails_to_their_recipient(caplog):
    """Development and tests only: production refuses to start without SMTP_URL while mail is enabled."""
    tampered = message("someone@example.com")
    tampered.replace_header("To", TAMPERED_TO)
    with caplog.at_level(logging.INFO, logger="app.mail.backends"):
        LogBackend().send(tampered)
    assert "mail to someone@example.com: Hello" in caplog.text and "#token=secret-token" in caplog.text


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SMTP_URL": "smtps://h", "APP_ENV": "production"}, "PUBLIC_BASE_URL"),
        ({"SMTP_URL": "smtp://127.0.0.1:1025"}, "PUBLIC_BASE_URL is required when SMTP_URL is set"),  # development
        ({"SMTP_URL": "smtp://h", "SMTP_STARTTLS": "never", "APP_ENV": "test"}, "PUBLIC_BASE_URL"),
        ({"SMTP_STARTTLS": "sometimes"}, "SMTP_STARTTLS"),
        ({"MAIL_FROM": "no address here"}, "MAIL_FROM"),
        ({"MAIL_FROM": "a@b.example\r\nBcc: x@y.example"}, "MAIL_FROM"),
        ({"PUBLIC_BASE_URL": "ftp://x"}, "PUBLIC_BASE_URL"),
        ({"MAIL_RETRY_SCHEDULE": "0,5"}, "MAIL_RETRY_SCHEDULE"),
        ({"SMTP_TIMEOUT_SECONDS": "0"}, "SMTP_TIMEOUT_SECONDS"),
        ({"REQUIRE_VERIFIED_EMAIL": "maybe"}, "REQUIRE_VERIFIED_EMAIL"),
    ],
)
def test_mail_settings_are_checked_at_start(tmp_path, env, named):
    base = {"SECRET_KEY": STRONG, "JWT_SECRET": STRONG, "DATA_DIR": str(tmp_path)}
    with pytest.raises(SettingsError, match=named):
        load_settings({**base, **env})


def test_mail_settings_defaults(tmp_path):
    settings = load_settings({"SECRET_KEY": STRONG, "JWT_SECRET": STRONG, "DATA_DIR": str(tmp_path)})
    assert settings.mail.smtp_url is None and settings.require_verified_email is False
    assert settings.mail.starttls == "always" and settings.mail.public_base_url is None
    assert settings.mail.retry_schedule == (5, 30, 120, 300, 600) and settings.rate_limit_mail == "5/hour"
    production = load_settings(
        {
            "APP_ENV": "production",
            "SECRET_KEY": STRONG,
            "JWT_SECRET": STRONG,
            "SMTP_URL": "smtp://user:pa%40ss@mail.example.test:587",
            "PUBLIC_BASE_URL": "https://auth.example.test/",
        }
    )
    assert production.mail.public_base_url == "https://auth.example.test"
    assert "pa%40ss" not in repr(production)
    smtp = SmtpBackend(str(production.mail.smtp_url), "a@example.test", 5)
    assert (smtp.host, smtp.port, smtp.username, smtp.password) == ("mail.example.test", 587, "user", "pa@ss")
    assert "pa" not in smtp.describe()
