"""The page's "Recent activity" panel (GET /auth/activity through client.js), in real Chromium behind nginx:
a user sees their own logins, devices and security changes, who made a change that was not theirs, and
older pages on demand."""

from __future__ import annotations

import re
import uuid

import pytest
import requests
from playwright.sync_api import expect

from app import create_app
from app.audit.entries import TYPES
from app.auth.users import create_user
from tests.browser.conftest import Stack
from tests.browser.test_page import log_in, register
from tests.servers import ROOT
from tests.utils import DEFAULT_PASSWORD, bearer, random_email

pytestmark = pytest.mark.not_on_cluster("the browser page: a UI test over an endpoint proved on both modes elsewhere")


@pytest.fixture(scope="module")
def stack(base_env, tmp_path_factory):
    running = Stack(base_env, tmp_path_factory.mktemp("activity")).start()
    yield running
    running.stop()


def login(stack: Stack, email: str, password: str = DEFAULT_PASSWORD, device: str = "a script") -> requests.Response:
    body = {"email": email, "password": password, "transport": "body", "device": device}
    return requests.post(f"{stack.url}/auth/login", json=body, timeout=10)


def item(page, entry_type: str):
    """The newest activity item of this type."""
    return page.locator(f'#activity-list li[data-type="{entry_type}"]').first


def test_a_user_sees_their_logins_devices_and_security_changes(stack, base_env, new_context):
    email = register(stack.url)
    page = new_context().new_page()
    log_in(page, stack.url, email)
    expect(page.get_by_role("heading", name="Recent activity")).to_be_visible()
    newest = page.locator("#activity-list li").first
    expect(newest).to_have_attribute("data-type", "login.succeeded")
    expect(newest.locator(".what")).to_have_text("Logged in on Chrome on Linux")  # this page's device name
    expect(newest.locator(".where")).to_have_text("from 127.0.0.1")
    expect(item(page, "user.registered").locator(".what")).to_have_text("Account created")

    # Another device logs in; the user ends its session from this page.
    assert login(stack, email, device="Old tablet").status_code == 200
    tablet = page.locator("#sessions li", has_text="Old tablet")
    tablet.get_by_role("button", name="End the session on Old tablet").click()
    expect(tablet).to_have_count(0)
    expect(item(page, "session.revoked").locator(".what")).to_have_text("A device's session was ended")
    expect(item(page, "login.succeeded").locator(".what")).to_have_text("Logged in on Old tablet")

    # A wrong password, and a change an administrator made: shown on the next refresh, marked as such.
    assert login(stack, email, password="not the password").status_code == 401
    admin_email = random_email()
    with create_app(base_env).app_context():
        create_user(admin_email, DEFAULT_PASSWORD, role="admin")
    user_id = page.evaluate("window.authRt.client.me().then((user) => user.id)")
    admin_token = login(stack, admin_email).json()["access_token"]
    changed = requests.patch(
        f"{stack.url}/admin/users/{user_id}", json={"role": "admin"}, headers=bearer(admin_token), timeout=10
    )
    assert changed.status_code == 200, changed.text
    page.get_by_role("button", name="Refresh the activity").click()
    expect(item(page, "role.changed").locator(".what")).to_have_text("Role changed to admin by an administrator")
    failed = item(page, "login.failed")
    expect(failed.locator(".what")).to_have_text("A login with your address failed")
    expect(failed).to_have_attribute("data-kind", "warning")


def test_older_activity_comes_a_page_at_a_time(stack, new_context):
    email = register(stack.url)
    for _ in range(25):  # with the registration and the page's login: 27 entries, a page being 20
        assert login(stack, email, password="not the password").status_code == 401
    page = new_context().new_page()
    log_in(page, stack.url, email)
    items = page.locator("#activity-list li")
    expect(items).to_have_count(20)
    page.get_by_role("button", name="Show older activity").click()
    expect(items).to_have_count(27)
    expect(page.get_by_role("button", name="Show older activity")).to_be_hidden()
    expect(items.last).to_have_attribute("data-type", "user.registered")
    expect(items.first).to_have_attribute("data-type", "login.succeeded")


def phrased_types() -> set[str]:
    """The audit types the page's table ACTIVITY_TEXTS (app/static/app.js) has a phrase for."""
    script = (ROOT / "app" / "static" / "app.js").read_text()
    table = re.search(r"^const ACTIVITY_TEXTS = \{\n(.*?)^\};", script, re.MULTILINE | re.DOTALL)
    assert table, "app.js has no ACTIVITY_TEXTS table"
    return set(re.findall(r'^  "?([a-z_.]+)"?: ', table.group(1), re.MULTILINE))


def test_the_page_has_plain_words_for_every_type_of_entry_the_service_records():
    """Every type /auth/activity can answer (any the service records about a user) has a phrase, and the table
    names no type the service does not have."""
    phrased = phrased_types()
    assert {"user.registered", "login.succeeded", "logout"} <= phrased  # the table is read
    assert sorted(set(TYPES) - phrased) == [], "types without words on the page"
    assert sorted(phrased - set(TYPES)) == [], "words for types the service does not record"


def test_a_change_made_on_the_command_line_reads_in_plain_words(stack, new_context, module_cli):
    email = register(stack.url)
    page = new_context().new_page()
    log_in(page, stack.url, email)
    namespace = f"hall-{uuid.uuid4().hex[:8]}"
    assert module_cli("channels", "namespace-put", namespace, "--publish", "subscribers").returncode == 0
    assert module_cli("channels", "grant", f"{namespace}:stage", email, "--expires-in", "3600").returncode == 0
    assert module_cli("channels", "revoke", f"{namespace}:stage", email).returncode == 0
    page.get_by_role("button", name="Refresh the activity").click()
    by_cli = ", by an administrator on the service's command line"
    expect(item(page, "channel.member_added").locator(".what")).to_have_text(
        f"Let into the room {namespace}:stage for 60 minutes{by_cli}"
    )
    expect(item(page, "channel.member_removed").locator(".what")).to_have_text(
        f"No longer let into the room {namespace}:stage{by_cli}"
    )
