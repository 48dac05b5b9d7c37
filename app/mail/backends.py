"""Where mail goes: an SMTP server (STARTTLS or implicit TLS, certificate verified), or the log.

Plain text only when the operator says so (`SMTP_STARTTLS=never`: a relay on loopback, a development
mail catcher); with the default, a server that offers no STARTTLS gets nothing, never a fallback.

Both raise `TransientMailError` for what may work later (the server is down, says 4xx, the connection
breaks) and `PermanentMailError` for what never will (5xx for this message); the queue retries only the
first. Sockets are gevent's in the workers, so a slow server blocks nobody but the sending greenlet.

A message is a `Mail`: it names its one recipient, and the envelope goes to that address alone.
"""

from __future__ import annotations

import logging
import smtplib
import ssl
from email.message import EmailMessage
from email.utils import parseaddr
from urllib.parse import unquote, urlsplit

log = logging.getLogger(__name__)


class Mail(EmailMessage):
    """A message for one mailbox. The envelope recipient and the `To` header are both that address, set
    here; neither is ever read back out of a header (a parser may find other mailboxes in one)."""

    def __init__(self, recipient: str = "", *, policy=None):
        # `policy` alone: how the email package makes the parts of a multipart message, which have none.
        super().__init__(policy=policy)
        self.recipient = recipient
        if recipient:
            self["To"] = recipient


class TransientMailError(Exception):
    """Sending failed in a way that may succeed later: retry."""


class PermanentMailError(Exception):
    """The server refused this message for good: do not retry."""


class SmtpBackend:
    """SMTP: `smtp://` upgrades with STARTTLS (required unless `starttls="never"`), `smtps://` speaks TLS
    from the start."""

    def __init__(self, url: str, mail_from: str, timeout: float, starttls: str = "always"):
        if starttls not in ("always", "never"):
            raise ValueError(f"starttls must be 'always' or 'never', not {starttls!r}")
        parts = urlsplit(url)
        self.implicit_tls = parts.scheme == "smtps"
        self.starttls = starttls == "always" and not self.implicit_tls
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (465 if self.implicit_tls else 587)
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password or "")
        self.timeout = timeout
        self.envelope_from = parseaddr(mail_from)[1]
        self.local_hostname = self.envelope_from.rpartition("@")[2] or "localhost"
        self._tls: ssl.SSLContext | None = None

    def describe(self) -> str:
        """Where mail goes, without credentials (for the log)."""
        plain = "" if self.implicit_tls or self.starttls else " (plain text: SMTP_STARTTLS=never)"
        return f"{'smtps' if self.implicit_tls else 'smtp'}://{self.host}:{self.port}{plain}"

    def _tls_context(self) -> ssl.SSLContext:
        """Certificates verified against the system's CAs (SSL_CERT_FILE names another bundle), read at the first
        message: a context reads the whole bundle, tens of milliseconds of CPU on the worker's hub."""
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def send(self, mail: Mail) -> None:
        """Hand one message to the server, for its one recipient; raise Transient/PermanentMailError when it
        is not taken."""
        context = self._tls_context()
        try:
            if self.implicit_tls:
                smtp = smtplib.SMTP_SSL(
                    self.host, self.port, local_hostname=self.local_hostname, timeout=self.timeout, context=context
                )
            else:
                smtp = smtplib.SMTP(self.host, self.port, local_hostname=self.local_hostname, timeout=self.timeout)
        except (OSError, smtplib.SMTPException) as error:
            raise TransientMailError(f"cannot connect to {self.describe()}: {type(error).__name__}") from None
        try:
            if self.starttls:
                smtp.ehlo()
                if not smtp.has_extn("starttls"):
                    # Never fall back to plain text: the message carries a login link.
                    raise TransientMailError(f"{self.describe()} does not offer STARTTLS")
                smtp.starttls(context=context)
                smtp.ehlo()
            if self.username:
                smtp.login(self.username, self.password)
            # The envelope named outright: smtplib would otherwise take it from the To header as parsed.
            smtp.send_message(mail, from_addr=self.envelope_from, to_addrs=[_recipient(mail)])
        except smtplib.SMTPRecipientsRefused as error:
            codes = [code for code, _ in error.recipients.values()]
            kind = TransientMailError if all(400 <= code < 500 for code in codes) else PermanentMailError
            raise kind(f"recipient refused ({', '.join(map(str, codes))})") from None
        except smtplib.SMTPAuthenticationError as error:
            # A configuration problem, not this message's: keep it until the credentials are fixed.
            raise TransientMailError(f"authentication refused ({error.smtp_code})") from None
        except smtplib.SMTPResponseException as error:
            kind = TransientMailError if 400 <= error.smtp_code < 500 else PermanentMailError
            raise kind(f"the server answered {error.smtp_code}") from None
        except (OSError, smtplib.SMTPException) as error:  # includes ssl.SSLError and time-outs
            raise TransientMailError(f"{type(error).__name__} talking to {self.describe()}") from None
        finally:
            try:
                smtp.quit()
            except (OSError, smtplib.SMTPException):
                smtp.close()


class LogBackend:
    """No SMTP server configured (development and tests; production requires one while mail is enabled):
    write whole mails to the log."""

    def describe(self) -> str:
        """Where mail goes (for the log)."""
        return "the log"

    def send(self, mail: Mail) -> None:
        """Log the message: its recipient, subject and plain-text body."""
        body = mail.get_body(("plain",))
        text = body.get_content() if body is not None else ""
        log.info("mail to %s: %s\n%s", _recipient(mail), mail["Subject"], text)


def _recipient(mail: Mail) -> str:
    """The one address a message is for; a message that names none is never sent."""
    recipient = getattr(mail, "recipient", None)
    if not recipient:
        raise PermanentMailError("the message names no recipient")
    return recipient
