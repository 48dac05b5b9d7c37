"""A development mail catcher, started by `make run`: SMTP in, a web page out, nothing sent on.

Usage: python scripts/mailcatcher.py [--smtp-port 1025] [--web-port 8025]

It takes every message offered over plain SMTP (no TLS, no AUTH: the service's SMTP_STARTTLS=never) on
127.0.0.1:<smtp-port>, keeps the latest 100 in memory, prints each one's recipients, subject and links, and
shows them newest first at http://127.0.0.1:<web-port>/, the links clickable. Both listen on loopback only:
the mails carry login links. SIGTERM or SIGINT stops it (status 0).
"""

from __future__ import annotations

import argparse
import collections
import email
import email.policy
import html
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aiosmtpd.controller import Controller

KEPT = 100
LINK = re.compile(r"https?://[^\s<>\"']+")
HOST = "127.0.0.1"


@dataclass(frozen=True)
class Mail:
    """One message as received: the envelope's recipients, a few headers, and the text to show."""

    received: str
    mail_from: str
    recipients: tuple[str, ...]
    subject: str
    text: str

    @property
    def links(self) -> list[str]:
        """The http(s) links of the text, in order, without the punctuation a sentence puts after them."""
        return [link.rstrip(".,;:!?)]") for link in LINK.findall(self.text)]


def parse(mail_from: str, recipients: list[str], content: bytes) -> Mail:
    """A Mail from an SMTP transaction: the plain-text body, else the HTML one as source text."""
    message = email.message_from_bytes(content, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    body = message.get_body(("plain", "html"))
    text = body.get_content() if body is not None else ""
    return Mail(
        received=time.strftime("%H:%M:%S"),
        mail_from=mail_from,
        recipients=tuple(recipients),
        subject=str(message.get("Subject", "(no subject)")),
        text=text,
    )


class Mailbox:
    """The latest KEPT mails, newest first; written by the SMTP thread, read by the web page's threads."""

    def __init__(self) -> None:
        self._mails: collections.deque[Mail] = collections.deque(maxlen=KEPT)
        self._lock = threading.Lock()

    def add(self, mail: Mail) -> None:
        """Keep a mail, and say so on the console: a reset link is then one click away in make run's terminal."""
        with self._lock:
            self._mails.appendleft(mail)
        lines = [f"mail:    to {', '.join(mail.recipients)}: {mail.subject}"]
        lines += [f"         {link}" for link in mail.links]
        print("\n".join(lines), flush=True)

    def newest_first(self) -> list[Mail]:
        """Every kept mail, the newest first."""
        with self._lock:
            return list(self._mails)


class SmtpHandler:
    """aiosmtpd's handler: every message is accepted and kept, none is sent anywhere."""

    def __init__(self, mailbox: Mailbox):
        self.mailbox = mailbox

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802 - aiosmtpd's hook name
        """Keep the message and accept it."""
        content = envelope.original_content or envelope.content
        self.mailbox.add(parse(envelope.mail_from, list(envelope.rcpt_tos), content))
        return "250 OK: caught, not delivered"


def linked(text: str) -> str:
    """Text as HTML: everything escaped, http(s) links made into links."""
    parts, last = [], 0
    for match in LINK.finditer(text):
        link = match.group().rstrip(".,;:!?)]")
        parts += [html.escape(text[last : match.start()]), f'<a href="{html.escape(link)}">{html.escape(link)}</a>']
        last = match.start() + len(link)
    parts.append(html.escape(text[last:]))
    return "".join(parts)


def render(mails: list[Mail], smtp_port: int) -> str:
    """The page: every mail, newest first."""
    articles = "".join(
        f"<article><h2>{html.escape(mail.subject)}</h2>"
        f"<p class=meta>{mail.received} · to {html.escape(', '.join(mail.recipients))}"
        f" · from {html.escape(mail.mail_from)}</p><pre>{linked(mail.text)}</pre></article>"
        for mail in mails
    )
    empty = "<p>No mail yet. Reload this page after the service has sent one.</p>"
    return f"""<!doctype html>
<html lang="en">
<meta charset="utf-8">
<title>Mail caught by make run ({len(mails)})</title>
<style>
  body {{ font: 15px/1.4 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; }}
  article {{ border-top: 1px solid #ccc; padding: 0.5rem 0; }}
  h2 {{ font-size: 1.1rem; margin: 0.5rem 0 0.2rem; }}
  .meta {{ color: #555; margin: 0; }}
  pre {{ white-space: pre-wrap; word-break: break-all; }}
</style>
<h1>Mail caught by make run</h1>
<p>What the service sent to smtp://{HOST}:{smtp_port}, newest first (the latest {KEPT}). None of it left this
machine. Reload for new mail.</p>
{articles or empty}
</html>
"""


def page_handler(mailbox: Mailbox, smtp_port: int, web_port: int) -> type[BaseHTTPRequestHandler]:
    """The web page's request handler class, bound to the mailbox."""
    # A page on another site could resolve a name of its own to 127.0.0.1 (DNS rebinding) and read the mails
    # with the visitor's browser; its requests name that host, so only this machine's names are answered.
    hosts = {f"{HOST}:{web_port}", f"localhost:{web_port}"}

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's method name
            if self.headers.get("Host", "") not in hosts:
                self.answer(400, "text/plain", f"Open this page at http://{HOST}:{web_port}/\n")
            elif self.path.partition("?")[0] != "/":
                self.answer(404, "text/plain", "Not found\n")
            else:
                self.answer(200, "text/html", render(mailbox.newest_first(), smtp_port))

        def answer(self, status: int, content_type: str, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", f"{content_type}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            # Mails are the service's, but the addresses in them are whatever people registered with: no
            # script runs here, and a clicked link does not tell the next site where it came from.
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args) -> None:
            pass  # make run's console is for the mails, not for every page view

    return Page


def quiet_about_resets(loop, context: dict) -> None:
    """asyncio's exception handler, without a traceback for a client that reset its connection (a port probe
    such as `nc -z` hangs up on the greeting); anything else is reported as usual."""
    if not isinstance(context.get("exception"), ConnectionResetError):
        loop.default_exception_handler(context)


def main(argv: list[str] | None = None) -> int:
    """Catch mail until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--smtp-port", type=int, default=1025)
    parser.add_argument("--web-port", type=int, default=8025)
    args = parser.parse_args(argv)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    mailbox = Mailbox()
    try:
        web = ThreadingHTTPServer((HOST, args.web_port), page_handler(mailbox, args.smtp_port, args.web_port))
    except OSError as error:
        print(f"mail catcher: cannot serve its page on {HOST}:{args.web_port}: {error.strerror}", file=sys.stderr)
        return 1
    smtp = Controller(SmtpHandler(mailbox), hostname=HOST, port=args.smtp_port)
    smtp.loop.set_exception_handler(quiet_about_resets)
    try:
        # aiosmtpd reports a port already taken only after its start-up time-out (5 s): try it first.
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((HOST, args.smtp_port))
        smtp.start()
    except OSError as error:
        print(f"mail catcher: cannot take SMTP on {HOST}:{args.smtp_port}: {error.strerror}", file=sys.stderr)
        return 1
    threading.Thread(target=web.serve_forever, name="mail page", daemon=True).start()
    print(f"mail:    smtp://{HOST}:{args.smtp_port}, caught, none sent on; read at http://{HOST}:{args.web_port}/")
    sys.stdout.flush()
    stop.wait()
    smtp.stop()
    web.shutdown()
    web.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
