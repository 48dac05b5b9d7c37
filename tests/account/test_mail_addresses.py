"""One plain address per account, and mail to that address alone.

An address is `local@domain`: a dot-atom local part, host-name labels (an internationalised domain kept as
given and mailed in its IDNA form). What a header parser could read as another mailbox, or as several (an
encoded word, a comma, a quoted string, a comment, angle brackets, a group's colon), is refused at every
door; and a mail's envelope recipient and `To` header are the stored address itself, never what parsing a
header made of it. The attacks run against a live gunicorn that mails a real SMTP server.
"""

from __future__ import annotations

import uuid
from email.message import EmailMessage

import pytest
import requests

from app import mail
from app.mail.messages import MFA_ENABLED
from app.redis import Keys
from tests.account.conftest import mail_env
from tests.auth.test_oauth import browser, callback_url, finish, oauth_setup, secure_cookies_to_loopback  # noqa: F401
from tests.conftest import https_client
from tests.servers import LiveServer, wait_until
from tests.utils import DEFAULT_PASSWORD, bearer, random_email, redis_snapshot

# Each is mailed to someone else by a service that builds a To header from it and lets smtplib read the
# envelope back out of that header: the encoded word decodes to two mailboxes, `javascript:` opens a group
# whose one member is alert@example.com, and the markup is a display name and another address.
HOSTILE = {
    "encoded word": "=?utf-8?q?attacker=40evil.example=2c_?=ceo@corp.example",
    "scheme as a group": "javascript:alert(1)@example.com",
    "markup": "x<svg/onload=alert(1)>@example.com",
}

MALFORMED = {
    **HOSTILE,
    "quoted string": '"ceo"@corp.example',
    "quoted string with a space": '"a b"@example.com',
    "encoded word in base64": "=?utf-8?b?YUBldmlsLmV4YW1wbGU=?=@example.com",
    "encoded word mid-way": "a=?x?q?y?=b@example.com",
    "space": "a b@example.com",
    "comma": "a,b@example.com",
    "two addresses": "a@example.com,b@example.com",
    "colon": "a:b@example.com",
    "semicolon": "a;b@example.com",
    "angle brackets": "<a@example.com>",
    "display name": "Ada <a@example.com>",
    "comment": "a(comment)@example.com",
    "trailing comment": "a@example.com (comment)",
    "backslash": "a\\b@example.com",
    "NUL": "a\x00b@example.com",
    "tab": "a\tb@example.com",
    "trailing newline": "a@example.com\n",
    "header injection": "a@example.com\r\nBcc: attacker@evil.example",
    "DEL": "\x7fa@example.com",
    "C1 control": "a\x85@example.com",
    "leading dot": ".a@example.com",
    "trailing dot": "a.@example.com",
    "double dot": "a..b@example.com",
    "empty local part": "@example.com",
    "empty domain": "a@",
    "no @": "not-an-email",
    "empty": "",
    "two @": "a@b@example.com",
    "one label": "a@example",
    "label starting with a hyphen": "a@-example.com",
    "label ending with a hyphen": "a@example-.com",
    "underscore in the domain": "a@exa_mple.com",
    "empty label": "a@example..com",
    "leading dot in the domain": "a@.example.com",
    "trailing dot in the domain": "a@example.com.",
    "address literal": "a@[127.0.0.1]",
    "numeric top-level label": "a@127.0.0.1",
    "space in the domain": "a@exam ple.com",
    "fullwidth dot (not as given)": "a@example\uff0ecom",
    "non-ASCII local part": "\u00fc@example.com",
    "not IDNA: a bad A-label": "a@xn--abc.com",
    "not IDNA: a joiner out of context": "a@exa\u200dmple.com",
    "not IDNA: a symbol": "a@\u2603.example",
    "local part over 64": "x" * 65 + "@example.com",
    "over 254": "a@" + ("b" * 62 + ".") * 4 + "com",
    "over 254 in IDNA form": "a@" + ("\u00fc" * 30 + "a.") * 7 + "com",
}

VALID = {
    "  Ada.Lovelace@Example.COM ": "ada.lovelace@example.com",
    "o'brien+tag@example.com": "o'brien+tag@example.com",
    "x!#$%&'*+/=^?_`{|}~-@sub.example.co.uk": "x!#$%&'*+/=^?_`{|}~-@sub.example.co.uk",
    "a@b-c.example": "a@b-c.example",
    "Bob@B\u00dcCHER.example": "bob@b\u00fccher.example",
    "bob@xn--bcher-kva.example": "bob@xn--bcher-kva.example",
    "x" * 64 + "@example.com": "x" * 64 + "@example.com",
}


def parsed_recipients(header: str) -> set[str]:
    """The mailboxes a To header of this text names, as smtplib's send_message reads them."""
    message = EmailMessage()
    message["To"] = header
    return {address.addr_spec for address in message["To"].addresses}


# In process: every door refuses what is not one plain address, and stores nothing.


@pytest.mark.not_on_cluster("the address is refused before Redis is touched: one Redis shows nothing was kept")
def test_a_malformed_address_is_422_at_registration_and_forgot_and_nothing_is_kept(client, rdb):
    for case, address in MALFORMED.items():  # one app for them all: building one per case cost 0.2 s each
        register = client.post("/auth/register", json={"email": address, "password": DEFAULT_PASSWORD})
        forgot = client.post("/auth/password/forgot", json={"email": address})
        for answer in (register, forgot):
            assert answer.status_code == 422, (case, address, answer.get_json())
            assert answer.get_json()["error"]["code"] == "validation_failed", case
        assert redis_snapshot(rdb) == {}, case  # no account, no index, no mail job


@pytest.mark.parametrize("address", VALID, ids=repr)
def test_a_plain_address_is_kept_as_given_in_lower_case(client, rdb, address):
    answer = client.post("/auth/register", json={"email": address, "password": DEFAULT_PASSWORD})
    assert answer.status_code == 201, answer.get_json()
    assert answer.get_json()["user"]["email"] == VALID[address]
    login = client.post("/auth/login", json={"email": address, "password": DEFAULT_PASSWORD, "transport": "body"})
    assert login.status_code == 200


@pytest.mark.parametrize("address", HOSTILE.values(), ids=HOSTILE.keys())
def test_login_with_an_address_no_account_can_have_answers_as_for_an_unknown_one(client, address):
    unknown = client.post("/auth/login", json={"email": random_email(), "password": DEFAULT_PASSWORD})
    malformed = client.post("/auth/login", json={"email": address, "password": DEFAULT_PASSWORD})
    assert malformed.status_code == unknown.status_code == 401
    assert malformed.get_json() == unknown.get_json()


@pytest.mark.parametrize("address", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_cli_refuses_to_create_a_user_with_a_malformed_address(cli, rdb, address):
    created = cli("users", "create", "--email", address, "--password", DEFAULT_PASSWORD)
    assert created.returncode != 0 and "e-mail" in created.stderr, created
    assert redis_snapshot(rdb) == {}
    assert cli("users", "create", "--email", "ops@example.com", "--password", DEFAULT_PASSWORD).returncode == 0


def test_mail_disabled_queues_nothing(make_app, rdb):
    """MAIL_ENABLED=false: registration, forgot and resend answer as always, and no mail is queued."""
    enabled = https_client(make_app())
    assert (
        enabled.post("/auth/register", json={"email": random_email(), "password": DEFAULT_PASSWORD}).status_code == 201
    )
    assert rdb.zcard(Keys.mail_queue()) == 1  # the path does queue a mail when mail is on
    rdb.flushall()
    app = make_app(MAIL_ENABLED="false")
    client = https_client(app)
    email = random_email()
    assert client.post("/auth/register", json={"email": email, "password": DEFAULT_PASSWORD}).status_code == 201
    assert client.post("/auth/password/forgot", json={"email": email}).status_code == 202
    login = client.post("/auth/login", json={"email": email, "password": DEFAULT_PASSWORD, "transport": "body"})
    resend = client.post("/auth/email/verify/resend", headers=bearer(login.get_json()["access_token"]))
    assert resend.status_code == 202
    mail.start_background_tasks(app)  # no sender either
    assert not [key for key in redis_snapshot(rdb) if key.startswith("mail:")]


# Live: a gunicorn that mails a real SMTP server.


@pytest.fixture(scope="module")
def mailer(base_env, smtp, smtp_certificate, tmp_path_factory):
    live = LiveServer(
        {**base_env, **mail_env(smtp, smtp_certificate)}, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log"
    )
    live.start()
    yield live
    live.stop()


def queue_empty(redis_client) -> bool:
    return redis_client.zcard(Keys.mail_queue()) == 0


@pytest.mark.parametrize("address", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_address_is_refused_and_nobody_is_mailed(mailer, smtp, redis_client, address):
    forbidden = parsed_recipients(address)
    assert forbidden and address.lower() not in forbidden  # what the old code mailed instead
    seen = len(smtp.received)
    answer = requests.post(f"{mailer.url}/auth/register", json={"email": address, "password": DEFAULT_PASSWORD})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "validation_failed"
    assert redis_client.get(Keys.user_by_email(address.lower())) is None
    # The path mails when the address is plain: a registration after it is mailed, and once the queue is
    # empty, everything the refused one could have queued has been sent too.
    sentinel = random_email()
    answer = requests.post(f"{mailer.url}/auth/register", json={"email": sentinel, "password": DEFAULT_PASSWORD})
    assert answer.status_code == 201
    smtp.wait_for(sentinel, timeout=30)
    wait_until(lambda: queue_empty(redis_client), timeout=30, message="the mail queue to empty")
    for received in smtp.received[seen:]:
        assert not forbidden & set(received.recipients), received.recipients
        assert not forbidden & parsed_recipients(received.message["To"])


def test_an_internationalised_domain_is_mailed_in_its_idna_form_to_that_address_alone(mailer, smtp, redis_client):
    local = f"bob-{uuid.uuid4().hex[:8]}"
    given, mailbox = f"{local}@B\u00fccher.example", f"{local}@xn--bcher-kva.example"
    answer = requests.post(f"{mailer.url}/auth/register", json={"email": given, "password": DEFAULT_PASSWORD})
    assert answer.status_code == 201, answer.text
    assert answer.json()["user"]["email"] == f"{local}@b\u00fccher.example"  # kept as given (lower case)
    forgot = requests.post(f"{mailer.url}/auth/password/forgot", json={"email": f"{local}@b\u00fccher.example"})
    assert forgot.status_code == 202
    mails = smtp.wait_for(mailbox, count=2, timeout=30)
    wait_until(lambda: queue_empty(redis_client), timeout=30, message="the mail queue to empty")
    assert len(mails) == 2
    for received in mails:
        assert received.recipients == [mailbox]
        assert received.message["To"] == mailbox and parsed_recipients(received.message["To"]) == {mailbox}
    assert sorted(m.message["Subject"] for m in mails) == ["Confirm your e-mail address", "Reset your password"]
    assert not [r for r in smtp.received if local in str(r.recipients) and r.recipients != [mailbox]]


def test_a_stored_address_that_is_not_plain_is_never_mailed(make_app, smtp, smtp_certificate, monkeypatch):
    """An account stored before the rule with a hostile address: its notices go to nobody, where the old
    sender mailed every mailbox its To header parsed into. A plain stored address gets the same notice."""
    monkeypatch.setenv("SSL_CERT_FILE", str(smtp_certificate[0]))
    app = make_app(**mail_env(smtp, smtp_certificate))
    client = app.extensions["redis"]
    hostile, plain = HOSTILE["encoded word"], random_email()
    users = {}
    for address in (hostile, plain):
        user_id = uuid.uuid4().hex
        client.hset(Keys.user(user_id), mapping={"id": user_id, "email": address, "role": "user"})
        users[address] = user_id
    seen = len(smtp.received)
    queue = app.extensions["mail_queue"]
    with app.app_context():
        jobs = [mail.queue_mail(MFA_ENABLED, user_id=users[address]) for address in (hostile, plain)]
    # Claimed like a sender claims: the module's live gunicorn shares this Redis, and its sender may take
    # either job first; whoever holds a job alone sends it.
    while (job_id := queue.claim_next()) is not None:
        queue.process(job_id)
    [received] = smtp.wait_for(plain, timeout=30)
    assert received.recipients == [plain] and received.message["To"] == plain
    wait_until(lambda: not any(client.zscore(Keys.mail_queue(), job) for job in jobs), timeout=30)  # not retried
    assert [r.recipients for r in smtp.received[seen:]] == [[plain]]


@pytest.mark.parametrize(
    "address", [HOSTILE["encoded word"], HOSTILE["scheme as a group"]], ids=["encoded word", "scheme as a group"]
)
def test_an_oauth_provider_address_that_is_not_plain_is_refused(oauth_setup, redis_server, address):  # noqa: F811
    """The provider vouches for the address, but it is not one plain address: no account, nothing kept."""
    app, provider = oauth_setup
    client = browser()
    answer = finish(client, callback_url(client, app, provider, address))
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "validation_failed"
    assert redis_server.client().get(Keys.user_by_email(address.lower())) is None
    plain, other = random_email(), browser()  # the same way in with a plain address works
    assert finish(other, callback_url(other, app, provider, plain)).status_code == 302
