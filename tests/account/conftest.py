"""Fixtures for the account lifecycle: a real SMTP server and a live gunicorn that mails through it."""

from __future__ import annotations

import pytest

from tests.conftest import OWASP_HASHING
from tests.mailserver import SmtpServer
from tests.servers import LiveServer, make_certificate

PUBLIC_BASE_URL = "https://auth.example.test"
MAIL_FROM = "Example Accounts <accounts@example.test>"


@pytest.fixture(scope="session")
def smtp_certificate(tmp_path_factory):
    return make_certificate(tmp_path_factory.mktemp("smtp-tls"))


def mail_env(smtp: SmtpServer, certificate, **extra) -> dict:
    """Settings for a service that mails through `smtp` and trusts its certificate."""
    return {
        "SMTP_URL": smtp.url(),
        "MAIL_FROM": MAIL_FROM,
        "PUBLIC_BASE_URL": PUBLIC_BASE_URL,
        "SSL_CERT_FILE": str(certificate[0]),  # OpenSSL's own variable: the bundle that verifies servers
        **extra,
    }


@pytest.fixture(scope="module")
def smtp(smtp_certificate):
    """SMTP with STARTTLS required and AUTH, as a provider's submission port (587) speaks it."""
    server = SmtpServer(smtp_certificate, mode="starttls", auth=True).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mail_server(base_env, smtp, smtp_certificate, tmp_path_factory):
    """gunicorn (two workers) whose mail goes to `smtp`, hashing at production's cost (a timing test
    rules out a password hash on one path of a request only)."""
    live = LiveServer(
        {**base_env, **mail_env(smtp, smtp_certificate), **OWASP_HASHING},
        workers=2,
        log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log",
    )
    live.start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def redis_client(redis_server):
    return redis_server.client()


@pytest.fixture
def mfa_user(client, auth):
    """A user with TOTP on: their tokens, the secret and the ten recovery codes."""
    from tests.account.test_mfa import set_up_mfa, settle

    settle()
    tokens = auth.new_user_tokens()
    secret, codes = set_up_mfa(client, tokens["access_token"])
    return {**tokens, "secret": secret, "recovery_codes": codes}
