"""The admin console (`GET /admin`), proved in real Chromium behind nginx, with gunicorn, Redis and the
webhook delivery process: an administrator does every admin task of the API without a terminal, each
change shows in the audit log with its actor, and nobody else ever sees the console."""

from __future__ import annotations

import json
import re
import socket
import time
import uuid

import pyotp
import pytest
import requests
from playwright.sync_api import expect

from app import create_app
from app.apikeys.store import create_key
from app.auth.users import create_user
from tests.browser.conftest import ARTIFACTS, SCREENSHOTS_OF_EVERY_TEST, Stack
from tests.browser.test_page import log_in
from tests.issuers.issuer import AUDIENCE, Signer, claims, exchange_form
from tests.outgoing.receivers import DeliveryProcess, Receiver
from tests.servers import flush_redis
from tests.utils import DEFAULT_PASSWORD, bearer, random_email
from tests.webauthn_authenticator import Authenticator

pytestmark = pytest.mark.not_on_cluster("the admin console: a UI test over endpoints proved on both modes elsewhere")

# The receivers are on loopback, over plain HTTP; a failure is retried after 1 s, and again after 1 s, then it has
# failed (the console shows attempts and outcomes; the schedule itself is test_delivery's).
WEBHOOKS = {
    "WEBHOOK_OUT_ALLOW_PRIVATE": "true",
    "WEBHOOK_OUT_ALLOW_HTTP": "true",
    "WEBHOOK_OUT_RETRY_SCHEDULE": "1,1",
    "WEBHOOK_OUT_TIMEOUT_SECONDS": "2",
    "WEBHOOK_OUT_CONNECT_TIMEOUT_SECONDS": "1",
}


@pytest.fixture(scope="module")
def stack(base_env, redis_server, tmp_path_factory):
    """gunicorn behind nginx, and the delivery process that sends webhooks, on a Redis emptied of what earlier
    modules of the test process left there (the applications test expects none registered before its own)."""
    flush_redis(redis_server)
    directory = tmp_path_factory.mktemp("console")
    # One gunicorn worker: the console's pages and calls are one user's, and its endpoints are proven elsewhere.
    running = Stack(base_env, directory, workers=1, **WEBHOOKS).start()
    delivery = DeliveryProcess({**running.app.env}, directory / "worker.log").start()
    yield running
    delivery.stop()
    running.stop()


@pytest.fixture(scope="module")
def receiver():
    started = Receiver().start()
    yield started
    started.stop()


def make_user(base_env: dict, role: str = "user", email: str | None = None) -> tuple[str, str]:
    """A new account made in-process: its e-mail and id."""
    email = email or random_email()
    with create_app(base_env).app_context():
        user = create_user(email, DEFAULT_PASSWORD, role=role)
    return email, user["id"]


# How many lines an element's text takes (its text's boxes, by their tops): 1 for an address kept whole.
LINES_OF_TEXT = """element => {
  const range = document.createRange();
  range.selectNodeContents(element);
  return new Set([...range.getClientRects()].map((box) => Math.round(box.top))).size;
}"""
NARROW = {"width": 700, "height": 900}  # a window where the tables' columns must give way


def lines_of(locator) -> list[int]:
    """The number of lines each element `locator` finds takes."""
    return [element.evaluate(LINES_OF_TEXT) for element in locator.element_handles()]


def token_of(stack: Stack, email: str, device: str = "a script") -> str:
    """An access token of a new session of `email` (body transport), named `device` in its sessions."""
    body = {"email": email, "password": DEFAULT_PASSWORD, "transport": "body", "device": device}
    answer = requests.post(f"{stack.url}/auth/login", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()["access_token"]


def fill_login(page, email: str) -> None:
    """Log in with the form of the page already open (log_in opens `/` first, and so drops `?next=`)."""
    page.get_by_label("E-mail", exact=True).fill(email)
    page.get_by_label("Password", exact=True).fill(DEFAULT_PASSWORD)
    page.get_by_role("button", name="Log in", exact=True).click()


def console(page, stack: Stack, email: str) -> None:
    """Log in on the page as the administrator `email` and follow its link to the console."""
    log_in(page, stack.url, email)
    page.get_by_role("link", name="Admin console").click()
    expect(page).to_have_url(f"{stack.url}/admin")
    expect(page.get_by_role("heading", level=1)).to_have_text("auth-rt admin console")
    # The heading is the template's; the newest users are the script's first answer: its forms are wired by then
    # (a form used before that submits natively, and the page comes back empty).
    expect(page.locator("#user-list")).to_be_visible()


def open_console(page, stack: Stack, email: str) -> None:
    """Open the console as the administrator `email`, logging in on the way (the page sends them back to it):
    the shortest way in, for the tests of what is done inside (`console` follows the page's link)."""
    page.goto(stack.url + "/admin")
    fill_login(page, email)
    expect(page).to_have_url(f"{stack.url}/admin")
    expect(page.get_by_role("heading", level=1)).to_have_text("auth-rt admin console")
    # The heading is the template's; the newest users are the script's first answer: its forms are wired by then
    # (a form used before that submits natively, and the page comes back empty).
    expect(page.locator("#user-list")).to_be_visible()


def section(page, name: str) -> None:
    page.get_by_role("navigation", name="Console sections").get_by_role("link", name=name, exact=True).click()


def confirm(page, yes: str, *, cancel: bool = False) -> None:
    """Answer the console's confirmation step: `yes`, or Cancel."""
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Cancel" if cancel else yes, exact=True).click()
    expect(dialog).to_be_hidden()


def keep(page, name: str) -> None:
    """A screenshot of the console mid-test, kept with the browser tests' others (which show the end) when those
    of every test are asked for (BROWSER_SCREENSHOTS=all)."""
    if SCREENSHOTS_OF_EVERY_TEST:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def entry(container, entry_type: str, actor_id: str | None = None):
    """The newest audit entry of `entry_type` (by `actor_id`, when given) that `container` shows."""
    selector = f'tr.entry[data-type="{entry_type}"]'
    if actor_id is not None:
        selector += f'[data-actor-id="{actor_id}"]'
    return container.locator(selector).first


# ---- Who gets the console, and under which policy ----


def test_the_console_is_an_administrators_page_under_the_same_policy_as_the_page(stack, base_env):
    admin_email, _ = make_user(base_env, "admin")
    user_email, user_id = make_user(base_env)
    with create_app(base_env).app_context():
        key, _ = create_key("console test", ["audit:read"], [])
    page_policy = requests.get(stack.url + "/", timeout=10).headers["Content-Security-Policy"]

    answer = requests.get(stack.url + "/admin", headers=bearer(token_of(stack, admin_email)), timeout=10)
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("text/html")
    assert answer.headers["Content-Security-Policy"] == page_policy
    assert answer.headers["Cache-Control"] == "no-store"
    assert answer.headers["X-Frame-Options"] == "DENY"
    assert '<script type="module" src="/static/admin.js"></script>' in answer.text
    assert "<script>" not in answer.text and "<style" not in answer.text and "style=" not in answer.text
    assert requests.get(stack.url + "/static/admin.js", timeout=10).headers["Content-Security-Policy"] == page_policy

    # Without a session (no token, or an API key, which is no one who signs in): to the page, which
    # brings an administrator back once signed in.
    for headers in ({}, bearer(key)):
        answer = requests.get(stack.url + "/admin", headers=headers, allow_redirects=False, timeout=10)
        assert answer.status_code == 303 and answer.headers["Location"] == "/?next=/admin"
        assert answer.headers["Content-Security-Policy"] == page_policy

    # A signed-in user who is no administrator: refused, and nothing of the console in the answer.
    user_token = token_of(stack, user_email)
    answer = requests.get(stack.url + "/admin", headers=bearer(user_token), allow_redirects=False, timeout=10)
    assert answer.status_code == 403 and answer.headers["Content-Type"].startswith("text/html")
    assert answer.headers["Content-Security-Policy"] == page_policy
    assert "admin.js" not in answer.text and "API keys" not in answer.text and "administrators" in answer.text
    # Nor the endpoint the console reads a user from.
    refused = requests.get(f"{stack.url}/admin/users/{user_id}", headers=bearer(user_token), timeout=10)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"


def test_a_non_administrator_signed_in_or_not_never_sees_the_console(stack, base_env, new_context):
    email, _ = make_user(base_env)
    page = new_context().new_page()
    console_requests = []
    page.on("request", lambda request: "/admin" in request.url and console_requests.append(request.url))

    # Signed out: sent to the page, which asks for an administrator's login.
    page.goto(stack.url + "/admin")
    expect(page).to_have_url(f"{stack.url}/")
    expect(page.locator("#status")).to_have_text("Log in as an administrator to open the admin console.")
    # A user logs in there: told the console is not for them, and kept on the page.
    fill_login(page, email)
    expect(page.locator("#status")).to_have_text(f"Logged in as {email}")
    expect(page.locator("#notice")).to_have_text("The admin console is for administrators only.")
    expect(page).to_have_url(f"{stack.url}/")
    expect(page.get_by_role("link", name="Admin console")).to_be_hidden()

    # Signed in, asking for the console again: refused, with nothing of it.
    answer = page.goto(stack.url + "/admin")
    assert answer.status == 403
    expect(page.locator("#refused")).to_contain_text(f"{email} is not one")
    expect(page.locator("#users, #audit, #api-keys")).to_have_count(0)
    assert not [url for url in console_requests if "/static/admin.js" in url or "/admin/" in url]


def test_an_administrator_whose_access_token_expired_comes_back_to_the_console(stack, base_env, new_context):
    email, _ = make_user(base_env, "admin")
    context = new_context()
    page = context.new_page()
    console(page, stack, email)
    context.clear_cookies(name="__Host-access")  # as 15 minutes would; the refresh cookie stays
    page.goto(stack.url + "/admin")  # to the page, which refreshes the session and sends it back
    expect(page).to_have_url(f"{stack.url}/admin")
    expect(page.locator("#me")).to_have_text(email)


def test_an_administrator_who_logs_in_on_the_way_lands_in_the_console(stack, base_env, new_context):
    email, _ = make_user(base_env, "admin")
    page = new_context().new_page()
    page.goto(stack.url + "/admin")
    expect(page.locator("#status")).to_have_text("Log in as an administrator to open the admin console.")
    fill_login(page, email)
    expect(page).to_have_url(f"{stack.url}/admin")
    expect(page.locator("#me")).to_have_text(email)


# ---- Users ----


def add_passkey(stack: Stack, token: str, name: str) -> None:
    """A passkey for the token's user, registered over HTTP as a browser at `localhost` would."""
    port = stack.url.rsplit(":", 1)[1]
    headers = {**bearer(token), "Host": f"localhost:{port}"}
    device = Authenticator(origin=f"http://localhost:{port}", rp_id="localhost")
    options = requests.post(f"{stack.url}/auth/passkeys/register/options", headers=headers, timeout=10)
    assert options.status_code == 200, options.text
    credential = device.create(options.json()["options"])
    added = requests.post(
        f"{stack.url}/auth/passkeys", json={"credential": credential, "name": name}, headers=headers, timeout=10
    )
    assert added.status_code == 201, added.text


def turn_on_mfa(stack: Stack, token: str) -> None:
    setup = requests.post(f"{stack.url}/auth/mfa/totp/setup", headers=bearer(token), timeout=10)
    assert setup.status_code == 200, setup.text
    code = pyotp.TOTP(setup.json()["secret"]).now()
    confirmed = requests.post(
        f"{stack.url}/auth/mfa/totp/confirm", json={"code": code}, headers=bearer(token), timeout=10
    )
    assert confirmed.status_code == 200, confirmed.text


def test_an_administrator_finds_a_user_and_changes_role_mfa_sessions_and_deletes_them(stack, base_env, new_context):
    admin_email, admin_id = make_user(base_env, "admin")
    prefix = f"bob-{uuid.uuid4().hex[:8]}"
    email, user_id = make_user(base_env, email=f"{prefix}@example.com")
    namesakes = [make_user(base_env, email=f"{prefix}{end}@example.com")[0] for end in ("2", "-by")]
    phone = token_of(stack, email, device="Bob's phone")
    turn_on_mfa(stack, phone)
    add_passkey(stack, phone, "Bob's key")

    page = new_context().new_page()
    page.set_viewport_size(NARROW)
    open_console(page, stack, admin_email)
    # As the administrator types the start of an address (any case), the users whose address starts so show,
    # in the addresses' order ('-' and '2' come before '@'), each address on one line.
    page.get_by_label("Find users by e-mail").press_sequentially(prefix.upper())
    listed = page.locator("#user-list tbody tr a")
    expect(listed).to_have_text([namesakes[1], namesakes[0], email])
    expect(page.locator("#user-list-caption")).to_have_text(f'Users whose address starts with "{prefix.upper()}"')
    assert lines_of(listed) == [1, 1, 1]
    page.get_by_label("Find users by e-mail").fill(f"{prefix}-zz")
    expect(page.locator("#user-list-empty")).to_have_text(f'No user\'s address starts with "{prefix}-zz".')
    expect(page.locator("#user-list")).to_be_hidden()
    # Find opens the user whose whole address is typed.
    page.get_by_label("Find users by e-mail").fill(email)
    page.get_by_role("button", name="Find", exact=True).click()
    detail = page.locator("#user-detail")
    expect(detail.get_by_role("heading", level=3)).to_have_text(email)
    expect(page).to_have_url(f"{stack.url}/admin#user/{user_id}")
    expect(page.locator("#user-id")).to_have_text(user_id)
    expect(page.locator("#user-role")).to_have_text("user")
    expect(page.locator("#user-verified")).to_have_text("not verified")
    expect(page.locator("#user-mfa")).to_have_text("on (TOTP)")
    expect(page.locator("#user-sessions li")).to_have_count(1)
    expect(page.locator("#user-sessions li .device")).to_have_text("Bob's phone")
    expect(page.locator("#user-passkeys li .passkey-name")).to_have_text("Bob's key")
    trail = page.locator("#user-audit")
    for own in ("user.registered", "login.succeeded", "mfa.enabled", "passkey.added"):
        expect(entry(trail, own)).to_be_visible()
    expect(entry(trail, "login.succeeded").locator(".actor")).to_have_text(email)  # by themselves
    # Details in words, one "key: value" a line; the addresses in the narrow table each on one line.
    expect(entry(trail, "user.registered").locator(".details li")).to_have_text(["method: password", "role: user"])
    expect(entry(trail, "passkey.added").locator(".details")).not_to_contain_text("{")
    assert set(lines_of(trail.locator("tr.entry .user-ref"))) == {1}
    keep(page, "admin-console-user.png")

    # The role: a cancelled confirmation changes nothing; a confirmed one does, and the trail says who.
    page.get_by_label("Role", exact=True).select_option("admin")
    page.get_by_role("button", name="Change the role").click()
    confirm(page, "Change the role", cancel=True)
    assert admin_view(stack, admin_email, email)["role"] == "user"
    page.get_by_role("button", name="Change the role").click()
    confirm(page, "Change the role")
    expect(page.locator("#user-role")).to_have_text("admin")
    expect(page.locator("#user-message")).to_have_text(f"{email} is now an administrator.")
    expect(entry(trail, "role.changed", admin_id).locator(".actor")).to_have_text(admin_email)
    page.get_by_label("Role", exact=True).select_option("user")
    page.get_by_role("button", name="Change the role").click()
    confirm(page, "Change the role")
    expect(page.locator("#user-role")).to_have_text("user")
    expect(trail.locator('tr.entry[data-type="role.changed"]')).to_have_count(2)

    # MFA reset: the second factor is gone and so is every session.
    page.get_by_role("button", name="Reset MFA").click()
    confirm(page, "Reset MFA")
    expect(page.locator("#user-mfa")).to_have_text("off")
    expect(page.locator("#user-sessions li")).to_have_count(0)
    expect(entry(trail, "mfa.reset", admin_id)).to_be_visible()
    assert requests.get(f"{stack.url}/auth/me", headers=bearer(phone), timeout=10).status_code == 401

    # A new login, seen when the user is shown again, then ended from the console.
    laptop = token_of(stack, email, device="Bob's laptop")
    page.get_by_role("button", name="Find", exact=True).click()
    expect(page.locator("#user-sessions li .device")).to_have_text("Bob's laptop")
    page.get_by_role("button", name="End every session").click()
    confirm(page, "End every session")
    expect(page.locator("#user-sessions li")).to_have_count(0)
    expect(page.locator("#user-sessions-empty")).to_be_visible()
    expect(entry(trail, "session.revoked", admin_id)).to_be_visible()
    assert requests.get(f"{stack.url}/auth/me", headers=bearer(laptop), timeout=10).status_code == 401

    # Deleting: the account is gone, its audit trail stays and names who deleted it.
    page.get_by_role("button", name="Delete the user").click()
    expect(page.get_by_role("dialog")).to_contain_text("This cannot be undone.")
    confirm(page, "Delete the user")
    expect(detail).to_be_hidden()
    expect(page.locator("#status")).to_contain_text(f"{email} ({user_id}) is deleted.")
    assert admin_users(stack, admin_email, email) == []
    section(page, "Audit log")
    page.get_by_label("About (user e-mail or id)").fill(user_id)
    page.get_by_role("button", name="Show", exact=True).click()
    log = page.locator("#audit-log")
    expect(entry(log, "user.deleted", admin_id).locator(".actor")).to_have_text(admin_email)
    expect(entry(log, "user.deleted").locator("td").nth(3)).to_have_text(f"{user_id} (deleted)")


def admin_users(stack: Stack, admin_email: str, email: str) -> list[dict]:
    answer = requests.get(
        f"{stack.url}/admin/users", params={"email": email}, headers=bearer(token_of(stack, admin_email)), timeout=10
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["users"]


def admin_view(stack: Stack, admin_email: str, email: str) -> dict:
    [user] = admin_users(stack, admin_email, email)
    return user


# ---- API keys, webhooks sent, channels ----


def test_an_administrator_creates_an_api_key_shown_once_and_deletes_it(stack, base_env, new_context):
    admin_email, admin_id = make_user(base_env, "admin")
    name = f"billing-{uuid.uuid4().hex[:8]}"
    page = new_context().new_page()
    open_console(page, stack, admin_email)
    section(page, "API keys")
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("webhooks:manage", exact=True).check()
    page.get_by_label("events:publish", exact=True).check()
    page.get_by_label("Channels it may publish to").fill("broadcast, orders:*")
    page.get_by_role("button", name="Create the key").click()
    expect(page.locator("#key-created")).to_be_visible()
    key = page.locator("#key-secret").text_content()
    assert re.fullmatch(r"ak_\S{40,}", key)
    row = page.locator("#key-list tr.api-key", has_text=name)
    expect(row).to_contain_text("events:publish, webhooks:manage")
    expect(row).to_contain_text("broadcast, orders:*")
    key_id = row.get_attribute("data-key-id")
    listed = requests.get(f"{stack.url}/admin/webhook-endpoints", headers=bearer(key), timeout=10)
    assert listed.status_code == 200  # the key works, with the scopes chosen

    page.get_by_role("button", name="I have copied it").click()
    expect(page.locator("#key-created")).to_be_hidden()
    assert key not in page.content()  # shown once: gone from the page once put away
    keep(page, "admin-console-api-keys.png")

    row.get_by_role("button", name=f"Delete the API key {name}").click()
    confirm(page, "Delete the key")
    expect(row).to_have_count(0)
    assert requests.get(f"{stack.url}/admin/webhook-endpoints", headers=bearer(key), timeout=10).status_code == 401

    section(page, "Audit log")
    page.get_by_label("By (user e-mail or id, API key id, cli, system)").fill(admin_email)
    page.get_by_role("button", name="Show", exact=True).click()
    log = page.locator("#audit-log")
    for change in ("api_key.created", "api_key.deleted"):
        expect(entry(log, change, admin_id)).to_contain_text(key_id)
    assert key not in page.content()  # never a key in an entry


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def refresh_until(article, selector: str, timeout: float = 20.0):
    """Press the endpoint's Refresh until its messages show `selector` (deliveries take seconds)."""
    deadline = time.monotonic() + timeout
    found = article.locator(selector)
    while found.count() == 0:
        assert time.monotonic() < deadline, f"no {selector} within {timeout} s"
        article.get_by_role("button", name=re.compile("^Refresh the messages")).click()
        article.page.wait_for_timeout(250)
    return found.first


def test_an_administrator_manages_a_webhook_endpoint_and_its_messages(stack, base_env, new_context, receiver):
    admin_email, admin_id = make_user(base_env, "admin")
    admin_token = token_of(stack, admin_email)
    orders = f"orders-{uuid.uuid4().hex[:10]}"
    path = f"/console/{orders}"
    url = receiver.behave(path, fail_first=3)  # the first send and both retries fail, then it answers 204

    page = new_context().new_page()
    page.set_viewport_size(NARROW)
    open_console(page, stack, admin_email)
    # The plain page of webhooks sent (kept: no script, read by operators' scripts) leads to the console's.
    page.goto(stack.url + "/admin/webhooks")
    page.get_by_role("link", name="admin console").click()
    expect(page).to_have_url(f"{stack.url}/admin#webhooks")
    expect(page.get_by_role("heading", name="Webhooks sent", level=2)).to_be_visible()
    # Channel patterns follow the API keys' rule: a bad one is refused in words, naming it; a namespace's is kept.
    page.get_by_label("URL", exact=True).fill(url)
    page.get_by_label("Channels (comma separated").fill(f"{orders}, Orders:*")
    page.get_by_role("button", name="Add the endpoint").click()
    refusal = page.locator("#endpoint-error")
    expect(refusal).to_contain_text("Field 'channels': channel 2 ('Orders:*') is not a channel pattern: give")
    assert not re.search(r"\^|channels\.\d|pattern '", refusal.text_content())
    expect(page.locator("#endpoints article.endpoint")).to_have_count(0)
    page.get_by_label("Channels (comma separated").fill(f"{orders}, {orders}:*")
    page.get_by_label("Event names").fill("order.*")
    page.get_by_label("Description").fill("Billing")
    page.get_by_role("button", name="Add the endpoint").click()
    expect(page.locator("#endpoint-secret-box")).to_be_visible()
    secret = page.locator("#endpoint-secret").text_content()
    assert secret.startswith("whsec_")
    page.get_by_role("button", name="I have copied it").click()
    expect(page.locator("#endpoint-secret-box")).to_be_hidden()
    article = page.get_by_role("article", name=url)
    expect(article.locator(".state")).to_have_text("enabled")
    expect(article).to_contain_text("Billing")
    expect(article).to_contain_text(f"{orders}, {orders}:*")
    endpoint_id = article.get_attribute("data-endpoint-id")
    # A second endpoint where nothing listens: its attempts' error reads as words.
    unreachable = f"http://127.0.0.1:{closed_port()}/hook"
    page.get_by_label("URL", exact=True).fill(unreachable)
    page.get_by_label("Channels (comma separated").fill(orders)
    page.get_by_role("button", name="Add the endpoint").click()
    page.get_by_role("button", name="I have copied it").click()
    refused = page.get_by_role("article", name=unreachable)

    published = requests.post(
        f"{stack.url}/events",
        json={"channel": orders, "event": "order.paid", "data": {"n": 1}},
        headers=bearer(admin_token),
        timeout=10,
    )
    assert published.status_code == 201, published.text
    failed = refresh_until(article, 'tr.message[data-status="failed"]')
    expect(failed.locator(".attempts")).to_have_text("3")
    expect(failed.locator("td.last-attempt")).to_contain_text("HTTP 500 after ")
    assert lines_of(article.locator("table.messages th", has_text="Attempts")) == [1]  # the header is not split
    unsent = refresh_until(refused, "tr.message")
    expect(unsent.locator("td.last-attempt")).to_contain_text("could not connect: connection refused after ")
    refused.get_by_role("button", name=f"Delete the endpoint {unreachable}").click()
    confirm(page, "Delete the endpoint")
    expect(refused).to_have_count(0)
    failed.get_by_role("button", name=re.compile("^Send the message")).click()
    delivered = refresh_until(article, 'tr.message[data-status="delivered"]')
    expect(delivered.locator(".attempts")).to_have_text("4")
    assert len(receiver.wait_for(path, 4)) == 4

    article.get_by_role("button", name=f"Replay events to {url}").click()
    confirm(page, "Replay")
    expect(article.locator(".note")).to_have_text("1 message queued.")
    assert len(receiver.wait_for(path, 5)) == 5
    refresh_until(article, 'tr.message[data-status="delivered"] .attempts:text-is("5")')
    keep(page, "admin-console-webhooks.png")

    article.get_by_role("button", name=f"Disable the endpoint {url}").click()
    expect(article.locator(".state")).to_have_text("disabled")
    article.get_by_role("button", name=f"Enable the endpoint {url}").click()
    expect(article.locator(".state")).to_have_text("enabled")

    article.get_by_role("button", name=f"Rotate the secret of {url}").click()
    confirm(page, "Rotate the secret")
    expect(page.locator("#endpoint-secret")).to_have_text(re.compile(r"^whsec_"))
    assert page.locator("#endpoint-secret").text_content() != secret
    page.get_by_role("button", name="I have copied it").click()

    article.get_by_role("button", name=f"Delete the endpoint {url}").click()
    confirm(page, "Delete the endpoint")
    expect(article).to_have_count(0)
    gone = requests.get(f"{stack.url}/admin/webhook-endpoints/{endpoint_id}", headers=bearer(admin_token), timeout=10)
    assert gone.status_code == 404

    section(page, "Audit log")
    page.get_by_label("By (user e-mail or id, API key id, cli, system)").fill(admin_email)
    page.get_by_role("button", name="Show", exact=True).click()
    log = page.locator("#audit-log")
    for change in ("webhook_endpoint.created", "webhook_endpoint.updated", "webhook_endpoint.deleted"):
        by_admin = log.locator(f'tr.entry[data-type="{change}"][data-actor-id="{admin_id}"]', has_text=endpoint_id)
        expect(by_admin.first).to_be_visible()
    assert secret not in page.content()


def test_an_administrator_manages_namespaces_and_channel_members(stack, base_env, new_context):
    admin_email, admin_id = make_user(base_env, "admin")
    member_email, member_id = make_user(base_env)
    namespace = f"console-{uuid.uuid4().hex[:8]}"
    channel = f"{namespace}:lobby"
    page = new_context().new_page()
    open_console(page, stack, admin_email)
    section(page, "Channels")

    page.get_by_label("Namespace", exact=True).fill(namespace)
    page.get_by_label("Who may subscribe").select_option("members")
    page.get_by_label("Who may publish").select_option("subscribers")
    page.get_by_label("Presence", exact=True).check()
    page.get_by_role("button", name="Save the namespace").click()
    row = page.locator(f'#namespace-list tr[data-namespace="{namespace}"]')
    expect(row).to_contain_text("members")
    expect(row.locator("td").nth(4)).to_have_text("no")  # join and leave
    row.get_by_role("button", name=f"Edit the namespace {namespace}").click()
    expect(page.get_by_label("Namespace", exact=True)).to_have_value(namespace)
    page.get_by_label("Join and leave events").check()
    page.get_by_role("button", name="Save the namespace").click()
    expect(row.locator("td").nth(4)).to_have_text("yes")

    page.get_by_label("Channel", exact=True).fill(channel)
    page.get_by_role("button", name="Show the members").click()
    expect(page.locator("#members-empty")).to_be_visible()
    page.get_by_label("User (e-mail or id)").fill(member_email)
    page.get_by_label("Info (JSON object").fill('{"name": "Ada"}')
    page.get_by_label("Expires in (seconds").fill("3600")
    page.get_by_role("button", name="Grant", exact=True).click()
    member = page.locator(f'#member-list tr[data-user-id="{member_id}"]')
    expect(member.locator(".user-ref")).to_have_text(member_email)
    expect(member).to_contain_text('{"name":"Ada"}')
    expect(member.locator("time")).to_have_count(1)  # it expires
    keep(page, "admin-console-channels.png")
    member.get_by_role("button", name=f"Revoke the grant of {member_id}").click()
    confirm(page, "Revoke")
    expect(member).to_have_count(0)
    expect(page.locator("#members-empty")).to_be_visible()

    row.get_by_role("button", name=f"Delete the namespace {namespace}").click()
    confirm(page, "Delete the namespace")
    expect(row).to_have_count(0)

    section(page, "Audit log")
    page.get_by_label("By (user e-mail or id, API key id, cli, system)").fill(admin_email)
    page.get_by_role("button", name="Show", exact=True).click()
    log = page.locator("#audit-log")
    expect(log.locator('tr.entry[data-type="namespace.put"]')).to_have_count(2)
    for change in ("namespace.put", "namespace.deleted", "channel.member_added", "channel.member_removed"):
        expect(entry(log, change, admin_id)).to_contain_text(namespace)
    for change in ("channel.member_added", "channel.member_removed"):
        expect(entry(log, change, admin_id).locator("td").nth(3)).to_have_text(member_email)  # about the member


# ---- Trusted issuers ----


def test_an_administrator_manages_trusted_issuers_and_sees_their_users(stack, base_env, new_context):
    admin_email, admin_id = make_user(base_env, "admin")
    name = f"idp-{uuid.uuid4().hex[:8]}"
    iss = f"https://{name}.example"
    rsa = Signer.rsa()
    page = new_context().new_page()
    open_console(page, stack, admin_email)
    section(page, "Trusted issuers")
    expect(page.get_by_label("JWKS URL")).to_be_visible()  # the default kind of keys; the others hidden
    expect(page.get_by_label("Secret (at least 32 bytes")).to_be_hidden()

    page.get_by_label("Issuer name").fill(name)
    page.get_by_label("Issuer (the tokens' iss)").fill(iss)
    page.get_by_label("Audience").fill(AUDIENCE)
    page.get_by_label("Algorithms").fill("RS256")
    page.get_by_label("Keys", exact=True).select_option("jwks")
    expect(page.get_by_label("JWKS URL")).to_be_hidden()
    page.get_by_label("JWKS (JSON, public keys only)").fill(json.dumps({"keys": [rsa.jwk()]}))
    page.get_by_label("Channels claim").fill("rt")
    page.get_by_role("button", name="Save the issuer").click()
    row = page.locator(f'#issuer-list tr[data-issuer="{name}"]')
    expect(row.locator("td.keys")).to_have_text("1 key given")
    expect(row).to_contain_text("channels: rt")

    # Edited to an HMAC secret: a short one is refused with the service's word, then a good one is kept unseen.
    secret = "console-secret-" + uuid.uuid4().hex + uuid.uuid4().hex
    row.get_by_role("button", name=f"Edit the issuer {name}").click()
    expect(page.get_by_label("Issuer name")).to_have_value(name)
    page.get_by_label("Keys", exact=True).select_option("secret")
    page.get_by_label("Algorithms").fill("HS256")
    page.get_by_label("Secret (at least 32 bytes").fill("too short")
    page.get_by_role("button", name="Save the issuer").click()
    expect(page.locator("#issuer-error")).to_contain_text("32 bytes")
    page.get_by_label("Secret (at least 32 bytes").fill(secret)
    page.get_by_role("button", name="Save the issuer").click()
    expect(row.locator("td.keys")).to_have_text("a secret (not shown)")
    expect(page.locator("#issuer-error")).to_have_text("")
    assert secret not in page.content()
    keep(page, "admin-console-issuers.png")

    # A user of that issuer logs in here by exchanging its token, and shows as the issuer names them.
    token = Signer("HS256", secret).sign(claims(iss, "employee-7"), kid=False)
    exchanged = requests.post(f"{stack.url}/oauth/token", data=exchange_form(token), timeout=10)
    assert exchanged.status_code == 200, exchanged.text
    user_id, access = exchanged.json()["user"]["id"], exchanged.json()["access_token"]
    section(page, "Users")
    page.get_by_role("button", name="Newest users").click()
    page.locator(f'#user-list tr[data-user-id="{user_id}"] a').click()
    expect(page.locator("#user-detail h3")).to_have_text(f"employee-7 ({name})")
    expect(page.locator("#user-origin")).to_have_text(f"through the trusted issuer {name}, as employee-7")
    expect(page.locator("#user-sessions li")).to_have_count(1)

    section(page, "Trusted issuers")
    row.get_by_role("button", name=f"Delete the issuer {name}").click()
    confirm(page, "Delete the issuer")
    expect(row).to_have_count(0)
    assert requests.get(f"{stack.url}/auth/me", headers=bearer(access), timeout=10).status_code == 401

    section(page, "Audit log")
    page.get_by_label("By (user e-mail or id, API key id, cli, system)").fill(admin_email)
    page.get_by_role("button", name="Show", exact=True).click()
    log = page.locator("#audit-log")
    expect(log.locator('tr.entry[data-type="issuer.put"]')).to_have_count(2)
    expect(entry(log, "issuer.deleted", admin_id)).to_contain_text(name)
    assert secret not in page.content()


# ---- Applications (OpenID clients) ----


def registered_client(base_env: dict, client_id: str):
    """The client as the provider looks it up (None once deleted), read in process from the stack's Redis."""
    from app.oidc.clients import get_client

    with create_app(base_env).app_context():
        return get_client(client_id)


def test_an_administrator_registers_applications_rotates_a_secret_and_deletes_one(stack, base_env, new_context):
    admin_email, admin_id = make_user(base_env, "admin")
    name = f"Shop {uuid.uuid4().hex[:8]}"
    page = new_context().new_page()
    open_console(page, stack, admin_email)
    section(page, "Applications (OpenID clients)")
    form = page.locator("#oauth-client-form")

    # A redirect URI with a fragment is refused with the service's word, and nothing is registered.
    page.get_by_label("Application name").fill(name)
    page.get_by_label(re.compile(r"^Redirect URIs")).fill("https://shop.example/cb#top")
    page.get_by_role("button", name="Register the application").click()
    expect(page.locator("#oauth-client-error")).to_contain_text("fragment")
    expect(page.locator("#oauth-clients-empty, #oauth-client-list tr.oauth-client")).to_have_count(1)

    # A web app with a backend: its secret is shown once.
    page.get_by_label(re.compile(r"^Redirect URIs")).fill("https://shop.example/cb\n\nhttp://127.0.0.1:3000/cb\n")
    form.locator("#oauth-client-grant-types").get_by_label("client_credentials").check()
    form.get_by_label("email", exact=True).check()
    page.get_by_role("button", name="Register the application").click()
    expect(page.locator("#oauth-client-secret-box")).to_be_visible()
    expect(page.locator("#oauth-client-error")).to_have_text("")
    secret = page.locator("#oauth-client-secret").text_content()
    assert re.fullmatch(r"cs_[A-Za-z0-9_-]{43}", secret)
    row = page.locator("#oauth-client-list tr.oauth-client", has_text=name)
    expect(row).to_contain_text("https://shop.example/cb, http://127.0.0.1:3000/cb")
    expect(row).to_contain_text("authorization_code, refresh_token, client_credentials")
    expect(row).to_contain_text("openid, email")
    client_id = row.get_attribute("data-client-id")
    expect(page.locator("#oauth-client-secret-about")).to_contain_text(client_id)
    assert registered_client(base_env, client_id).check_client_secret(secret)
    page.locator("#oauth-client-secret-done").click()
    expect(page.locator("#oauth-client-secret-box")).to_be_hidden()
    assert secret not in page.content()  # shown once: gone from the page once put away

    # A mobile app: public, a private-use scheme, no secret to show or rotate.
    phone = f"Phone {uuid.uuid4().hex[:8]}"
    page.get_by_label("Application name").fill(phone)
    page.get_by_label("Application type").select_option("public")
    page.get_by_label(re.compile(r"^Redirect URIs")).fill("com.example.app:/oauth/cb")
    page.get_by_label("First party").check()
    page.get_by_role("button", name="Register the application").click()
    phone_row = page.locator("#oauth-client-list tr.oauth-client", has_text=phone)
    expect(phone_row.locator("td.type")).to_have_text("public, first party")
    expect(page.locator("#oauth-client-secret-box")).to_be_hidden()
    expect(phone_row.get_by_role("button", name=f"Rotate the secret of {phone}")).to_have_count(0)
    keep(page, "admin-console-oauth-clients.png")

    # Rotated: the new secret is shown once, and the old one stops working at once.
    row.get_by_role("button", name=f"Rotate the secret of {name}").click()
    confirm(page, "Rotate the secret")
    expect(page.locator("#oauth-client-secret-box")).to_be_visible()
    rotated = page.locator("#oauth-client-secret").text_content()
    assert rotated != secret
    found = registered_client(base_env, client_id)
    assert found.check_client_secret(rotated) and not found.check_client_secret(secret)
    page.locator("#oauth-client-secret-done").click()

    # Deleting asks first; cancelled, nothing happens; confirmed, the client is unknown at once.
    row.get_by_role("button", name=f"Delete the application {name}").click()
    confirm(page, "Delete the application", cancel=True)
    expect(row).to_have_count(1)
    row.get_by_role("button", name=f"Delete the application {name}").click()
    confirm(page, "Delete the application")
    expect(row).to_have_count(0)
    assert registered_client(base_env, client_id) is None
    expect(phone_row).to_have_count(1)

    section(page, "Audit log")
    page.get_by_label("By (user e-mail or id, API key id, cli, system)").fill(admin_email)
    page.get_by_role("button", name="Show", exact=True).click()
    log = page.locator("#audit-log")
    expect(log.locator('tr.entry[data-type="oauth_client.created"]')).to_have_count(2)
    expect(entry(log, "oauth_client.updated", admin_id).locator(".details")).to_contain_text("changed: secret")
    expect(entry(log, "oauth_client.deleted", admin_id)).to_contain_text(client_id)
    assert secret not in page.content() and rotated not in page.content()


# ---- The audit log: filters and pages ----


def test_the_audit_log_filters_by_subject_type_and_actor_and_pages_back(stack, base_env, new_context):
    admin_email, admin_id = make_user(base_env, "admin")
    email, user_id = make_user(base_env)
    wrong = {"email": email, "password": "not the password", "transport": "body"}
    with requests.Session() as http:  # one kept-alive connection for all of them
        for _ in range(55):  # more than a page of the console's 50
            assert http.post(f"{stack.url}/auth/login", json=wrong, timeout=10).status_code == 401
    token_of(stack, email)

    page = new_context().new_page()
    open_console(page, stack, admin_email)
    section(page, "Audit log")
    log = page.locator("#audit-log")
    expect(log.locator("tr.entry").first).to_be_visible()  # the newest entries, unfiltered

    page.get_by_label("About (user e-mail or id)").fill(email)
    page.get_by_label("Type", exact=True).select_option("login.failed")
    page.get_by_role("button", name="Show", exact=True).click()
    rows = log.locator("tr.entry")
    expect(rows).to_have_count(50)
    expect(log.locator('tr.entry:not([data-type="login.failed"])')).to_have_count(0)
    expect(log.locator(f'tr.entry:not([data-subject="{user_id}"])')).to_have_count(0)
    expect(entry(log, "login.failed").locator(".actor")).to_have_text("the service")
    page.get_by_role("button", name="Show older entries").click()
    expect(rows).to_have_count(55)
    expect(page.get_by_role("button", name="Show older entries")).to_be_hidden()

    # By actor: the user's own login is theirs; the failures are the service's.
    page.get_by_label("Type", exact=True).select_option("")
    page.get_by_label("By (user e-mail or id, API key id, cli, system)").fill(email)
    page.get_by_role("button", name="Show", exact=True).click()
    expect(rows).to_have_count(1)
    expect(entry(log, "login.succeeded", user_id)).to_be_visible()
    page.get_by_label("By (user e-mail or id, API key id, cli, system)").fill("system")
    page.get_by_role("button", name="Show", exact=True).click()
    expect(rows).to_have_count(50)
    page.get_by_label("By (user e-mail or id, API key id, cli, system)").fill("nobody@example.com")
    page.get_by_role("button", name="Show", exact=True).click()
    expect(page.locator("#audit-error")).to_have_text("No user has the address nobody@example.com.")

    # A user named in an entry opens in the console.
    page.get_by_role("button", name="Clear the filters").click()
    page.get_by_label("About (user e-mail or id)").fill(user_id)
    page.get_by_role("button", name="Show", exact=True).click()
    entry(log, "login.succeeded").locator(".actor a").click()
    expect(page).to_have_url(f"{stack.url}/admin#user/{user_id}")
    expect(page.locator("#user-detail h3")).to_have_text(email)
