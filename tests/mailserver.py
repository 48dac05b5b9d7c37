"""A real SMTP server for tests (aiosmtpd on a loopback port) that records every message it accepts.

It speaks STARTTLS (required before MAIL), implicit TLS (smtps) or plain SMTP, optionally with AUTH,
using a certificate made here for 127.0.0.1; the service trusts it through SSL_CERT_FILE, as an
operator would trust a private CA.
"""

from __future__ import annotations

import email
import email.policy
import re
import ssl
import threading
import time
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.servers import free_port

SMTP_USER, SMTP_PASSWORD = "mailer", "smtp-secret-pass"


@dataclass
class Received:
    """One accepted message: the envelope and the parsed message."""

    mail_from: str
    recipients: list[str]
    message: EmailMessage

    @property
    def text(self) -> str:
        return self.message.get_body(("plain",)).get_content()

    @property
    def html(self) -> str:
        return self.message.get_body(("html",)).get_content()

    def link(self) -> str:
        """The one link of the plain-text body."""
        links = re.findall(r"https?://\S+", self.text)
        assert len(links) == 1, self.text
        return links[0]

    def token(self) -> str:
        """The token the link carries in its fragment."""
        return self.link().partition("#token=")[2]


class _Recorder:
    def __init__(self, server: SmtpServer):
        self.server = server

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802 - aiosmtpd's hook
        if self.server.refuse_recipients:
            return self.server.refuse_recipients
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
        message = email.message_from_bytes(envelope.original_content or envelope.content, policy=email.policy.default)
        self.server.record(Received(envelope.mail_from, list(envelope.rcpt_tos), message))
        return "250 OK"


class SmtpServer:
    """aiosmtpd with TLS as asked; `received` grows as messages arrive, `wait_for` awaits them."""

    def __init__(self, certificate: tuple[Path, Path] | None, mode: str = "starttls", auth: bool = True, port: int = 0):
        self.mode = mode  # starttls | smtps | plain (a development mail catcher: no certificate needed)
        self.auth = auth
        self.port = port or free_port()
        self.context = None
        if certificate is not None:
            self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.context.load_cert_chain(*map(str, certificate))
        assert self.context is not None or (mode == "plain" and not auth), "TLS (and AUTH) need a certificate"
        self.refuse_recipients: str | None = None  # e.g. "550 no such mailbox": answer every RCPT so
        self.received: list[Received] = []
        self.logins: list[str] = []
        self._changed = threading.Condition()
        self.controller: Controller | None = None

    def url(self, with_credentials: bool = True) -> str:
        scheme = "smtps" if self.mode == "smtps" else "smtp"
        credentials = f"{SMTP_USER}:{SMTP_PASSWORD}@" if with_credentials and self.auth else ""
        return f"{scheme}://{credentials}127.0.0.1:{self.port}"

    def _authenticate(self, server, session, envelope, mechanism, auth_data):
        ok = isinstance(auth_data, LoginPassword) and (auth_data.login, auth_data.password) == (
            SMTP_USER.encode(),
            SMTP_PASSWORD.encode(),
        )
        if ok:
            self.logins.append(SMTP_USER)
        return AuthResult(success=ok)

    def start(self) -> SmtpServer:
        options = {"hostname": "127.0.0.1", "port": self.port, "server_hostname": "localhost"}
        if self.mode == "starttls":
            options.update(tls_context=self.context, require_starttls=True)
        elif self.mode == "smtps":
            # aiosmtpd offers AUTH only after STARTTLS, so an smtps server here takes mail without it.
            assert not self.auth, "aiosmtpd does not offer AUTH over implicit TLS"
            options.update(ssl_context=self.context)
        if self.auth:
            options.update(authenticator=self._authenticate, auth_required=True)
        self.controller = Controller(_Recorder(self), **options)
        self.controller.start()
        return self

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None

    def record(self, received: Received) -> None:
        with self._changed:
            self.received.append(received)
            self._changed.notify_all()

    def to(self, address: str) -> list[Received]:
        return [r for r in self.received if address in r.recipients]

    def wait_for(self, address: str, count: int = 1, timeout: float = 10.0) -> list[Received]:
        """The messages to `address` once there are at least `count` of them (fails after `timeout`)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.to(address)) < count:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no mail to {address} within {timeout} s (got {len(self.to(address))})"
                self._changed.wait(remaining)
            return self.to(address)
