"""The mails the service sends: built from templates (plain text and HTML) when a job is sent.

A job names a kind and a recipient; building it issues the token its link carries, so the token
exists only in the message. A job whose recipient no longer needs it (account deleted, address
already verified, no account with that address) builds nothing. A message goes to the account's
stored address alone, its domain in IDNA form; an account stored before addresses had to be one plain
address, with one that is not, is never mailed.
"""

from __future__ import annotations

from email.utils import formatdate, parseaddr

from flask import current_app, render_template

from ..auth import emails, mailtokens, users
from .backends import Mail, PermanentMailError

VERIFY_EMAIL, PASSWORD_RESET = "verify_email", "password_reset"
#: An invitation to an organization: to an address, which may have no account yet.
ORG_INVITATION = "org_invitation"
#: Notices to an account's owner of a change to how it signs in; they carry no token.
MFA_ENABLED, MFA_RESET, MFA_LOCKED = "mfa_enabled", "mfa_reset", "mfa_locked"
PASSKEY_ADDED = "passkey_added"
NOTICES = (MFA_ENABLED, MFA_RESET, MFA_LOCKED, PASSKEY_ADDED)
#: How long a job of each kind is worth retrying: a reset nobody received within half an hour has
#: usually been asked for again; a verification link and a notice are useful for a day.
GIVE_UP_AFTER = {
    VERIFY_EMAIL: 24 * 3600,
    PASSWORD_RESET: 30 * 60,
    ORG_INVITATION: 24 * 3600,
    **dict.fromkeys(NOTICES, 24 * 3600),
}
SUBJECTS = {
    VERIFY_EMAIL: "Confirm your e-mail address",
    PASSWORD_RESET: "Reset your password",
    MFA_ENABLED: "Two-factor authentication is on",
    MFA_RESET: "Two-factor authentication was turned off by an administrator",
    MFA_LOCKED: "Two-factor login is locked after too many wrong codes",
    PASSKEY_ADDED: "A passkey was added to your account",
    ORG_INVITATION: "You are invited to join an organization",
}
PAGES = {VERIFY_EMAIL: "verify-email", PASSWORD_RESET: "reset-password"}


def build(job: dict) -> Mail | None:
    """The message for a job, with a fresh token in its link, or None when there is nothing to send."""
    kind = job["kind"]
    if kind == ORG_INVITATION:
        return _invitation(job)
    if kind in NOTICES:
        user = users.get_user(job.get("user_id", ""))
        if not user:
            return None
        context = {"email": user["email"], "link": f"{job['base_url']}/"}
        return compose(job["id"], mailbox(user), SUBJECTS[kind], f"mail/{kind}", context)
    if kind == VERIFY_EMAIL:
        user = users.get_user(job.get("user_id", ""))
        if not user or user.get("email_verified") == "1":
            return None
        to = mailbox(user)  # before a token is issued: none is made for a mail that is never sent
        token = mailtokens.issue_token(user["id"], user["email"], mailtokens.VERIFY)
    elif kind == PASSWORD_RESET:
        user_id = users.find_user_id_by_email(job.get("email", ""))
        user = users.get_user(user_id) if user_id else None
        if not user:
            return None  # forgot answers alike for unknown addresses, and mails only known ones
        to = mailbox(user)
        token = mailtokens.issue_token(user["id"], user["email"], mailtokens.RESET)
    else:
        raise ValueError(f"unknown mail kind {kind!r}")
    # The token travels in the fragment: browsers never send it to a server, so it stays out of
    # access logs, and the page posts it itself.
    link = f"{job['base_url']}/{PAGES[kind]}#token={token}"
    context = {
        "email": user["email"],
        "link": link,
        "hours": mailtokens.LIFETIMES[mailtokens.VERIFY] // 3600,
        "minutes": mailtokens.LIFETIMES[mailtokens.RESET] // 60,
    }
    return compose(job["id"], to, SUBJECTS[kind], f"mail/{kind}", context)


def _invitation(job: dict) -> Mail | None:
    """An invitation's mail with a fresh token (whose hash replaces any earlier one's), or None when the
    invitation was used, revoked or has expired, or its organization is gone."""
    from ..orgs import store as orgs

    to = _plain_mailbox(job.get("email", ""))
    org_id, invitation_id = job.get("org_id", ""), job.get("invitation_id", "")
    record, _ = orgs.get(org_id)
    token = orgs.issue_token(org_id, invitation_id) if record else None
    if token is None:
        return None
    invitation = orgs.invitation(org_id, invitation_id) or {}
    context = {
        "email": job["email"],
        "org_name": record["name"],
        "role": invitation.get("role", "member"),
        "link": f"{job['base_url']}/invitation?token={token}",
        "days": orgs.INVITATION_LIFETIME // (24 * 3600),
    }
    return compose(job["id"], to, SUBJECTS[ORG_INVITATION], f"mail/{ORG_INVITATION}", context)


def _plain_mailbox(address: str) -> str:
    """An address the service validated, as it is mailed; PermanentMailError for anything else."""
    try:
        return emails.mailbox(address)
    except emails.NotPlainAddress:
        raise PermanentMailError("the invited address is not one plain address; it is never mailed") from None


def mailbox(user: dict) -> str:
    """Where a user's mail goes: their stored address, its domain in IDNA form; PermanentMailError when
    the stored address is not one plain address (kept from before the rule: mailing it could reach others)."""
    try:
        return emails.mailbox(user["email"])
    except emails.NotPlainAddress:
        raise PermanentMailError("the account's stored address is not one plain address; it is never mailed") from None


def compose(job_id: str, to: str, subject: str, template: str, context: dict) -> Mail:
    """A multipart/alternative message for the one address `to`: the text template first, the HTML one as
    the alternative."""
    mail_from = current_app.config["SETTINGS"].mail.mail_from
    domain = parseaddr(mail_from)[1].rpartition("@")[2] or "localhost"
    message = Mail(to)
    message["From"] = mail_from
    message["Subject"] = subject
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = f"<{job_id}@{domain}>"  # the same for every attempt at this job
    message["Auto-Submitted"] = "auto-generated"
    message.set_content(render_template(f"{template}.txt", **context))
    message.add_alternative(render_template(f"{template}.html", **context), subtype="html")
    return message
