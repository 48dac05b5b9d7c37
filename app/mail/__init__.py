"""Outgoing mail: a durable queue in Redis, sent by a background greenlet over SMTP (or to the log)."""

from __future__ import annotations

from flask import Flask, current_app, has_request_context, request

from .backends import LogBackend, SmtpBackend
from .messages import GIVE_UP_AFTER, PASSWORD_RESET, VERIFY_EMAIL
from .queue import MailQueue

__all__ = ["PASSWORD_RESET", "VERIFY_EMAIL", "init_app", "queue_mail", "start_background_tasks"]


def init_app(app: Flask) -> None:
    """Choose the back-end (SMTP_URL, else the log) and bind the queue."""
    settings = app.config["SETTINGS"]
    if settings.mail.smtp_url:
        backend = SmtpBackend(str(settings.mail.smtp_url), settings.mail.mail_from, settings.mail.timeout_seconds)
    else:
        backend = LogBackend(include_body=not settings.production)
    app.extensions["mail_queue"] = MailQueue(app, app.extensions["redis"], backend)


def start_background_tasks(app: Flask) -> None:
    """Start this worker's mail sender (called once per gunicorn worker)."""
    app.extensions["mail_queue"].start()


def queue_mail(kind: str, *, user_id: str | None = None, email: str | None = None) -> str:
    """Queue a mail of `kind` for a user (or, for a reset, an address as typed); never waits for sending."""
    return current_app.extensions["mail_queue"].enqueue(
        kind, GIVE_UP_AFTER[kind], user_id=user_id, email=email, base_url=_base_url()
    )


def _base_url() -> str:
    """PUBLIC_BASE_URL; without it (development only) the origin the request came to, else localhost."""
    configured = current_app.config["SETTINGS"].mail.public_base_url
    if configured:
        return configured
    if has_request_context():
        return request.host_url.rstrip("/")
    return "http://localhost:8000"
