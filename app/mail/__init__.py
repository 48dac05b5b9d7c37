"""Outgoing mail: a durable queue in Redis, sent by a background greenlet over SMTP (or, in development,
to the log). With MAIL_ENABLED=false no mail is queued or sent at all."""

from __future__ import annotations

import logging

from flask import Flask, current_app

from .backends import LogBackend, SmtpBackend
from .messages import GIVE_UP_AFTER, ORG_INVITATION, PASSWORD_RESET, VERIFY_EMAIL
from .queue import MailQueue

__all__ = ["ORG_INVITATION", "PASSWORD_RESET", "VERIFY_EMAIL", "init_app", "queue_mail", "start_background_tasks"]

log = logging.getLogger(__name__)

#: Where links point without PUBLIC_BASE_URL, which only development and tests may leave unset (mail then
#: goes to the log): the address `make run` serves the browser page at, through nginx (README).
DEVELOPMENT_BASE_URL = "http://127.0.0.1:8080"


def init_app(app: Flask) -> None:
    """Choose the back-end (SMTP_URL, else the log) and bind the queue; none with MAIL_ENABLED=false."""
    mail = app.config["SETTINGS"].mail
    if not mail.enabled:
        app.extensions["mail_queue"] = None
        return
    if mail.smtp_url:
        backend = SmtpBackend(str(mail.smtp_url), mail.mail_from, mail.timeout_seconds, starttls=mail.starttls)
    else:  # development and tests: production refuses to start without SMTP_URL while mail is enabled
        backend = LogBackend()
    app.extensions["mail_queue"] = MailQueue(app, app.extensions["redis"], backend)


def start_background_tasks(app: Flask) -> None:
    """Start this worker's mail sender (called once per gunicorn worker); none with MAIL_ENABLED=false."""
    queue = app.extensions["mail_queue"]
    if queue is None:
        log.info("mail is off (MAIL_ENABLED=false): nothing is queued or sent")
        return
    queue.start()


def queue_mail(kind: str, *, user_id: str | None = None, email: str | None = None, **fields: str) -> str | None:
    """Queue a mail of `kind` for a user (or, for a reset or an invitation, an address); never waits for
    sending. `fields`: what else the kind's message is built from (an invitation's organization and id).

    Returns the job's id, or None when mail is off (MAIL_ENABLED=false): nothing is queued.
    """
    queue = current_app.extensions["mail_queue"]
    if queue is None:
        return None
    return queue.enqueue(kind, GIVE_UP_AFTER[kind], user_id=user_id, email=email, base_url=_base_url(), **fields)


def _base_url() -> str:
    """PUBLIC_BASE_URL, else (no SMTP_URL: mail goes to the log) the development address.

    Never the request's Host: a client chooses it, and a forged one would point a victim's reset link
    at the forger's site (host-header poisoning).
    """
    return current_app.config["SETTINGS"].mail.public_base_url or DEVELOPMENT_BASE_URL
